"""zckpt.iter_tensors: (name, tensor) one at a time in file order, from a container or a folder
converted by `zckpt convert`, every chunk checked, memory bounded to about one tensor."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

import zckpt
from zckpt_testing import HERE, flip_byte, run_cli, save_converted, storage_of


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=g, dtype=torch.float32).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(96, 32, generator=g),
        "model.layers.0.input_layernorm.weight": torch.rand(32, generator=g).half(),
        "model.layers.1.self_attn.q_proj.bias": torch.randn(32, generator=g, dtype=torch.float64),
        "lm_head.weight": torch.randn(64, 32, generator=g),
        "step": torch.tensor(7, dtype=torch.int64),
    }


def _convert_cli(src, out):
    r = run_cli("convert", src, "-o", out)
    assert r.returncode == 0, r.stderr


def _table_order(path):
    return zckpt._core.open(path).describe()["tensors"]


def test_safetensors_file_in_file_order(tmp_path):
    w = _weights()
    st = str(tmp_path / "model.safetensors")
    save_file(w, st)
    dst = str(tmp_path / "model.zckpt")
    _convert_cli(st, dst)
    got = list(zckpt.iter_tensors(dst))
    assert [n for n, _ in got] == _table_order(dst)
    ref = load_file(st)
    assert sorted(n for n, _ in got) == sorted(ref)
    for name, t in got:
        assert t.dtype == ref[name].dtype and t.shape == ref[name].shape and t.is_contiguous()
        assert torch.equal(t, ref[name]), name
    # a device given as torch.device; verify=False still yields the same bytes
    again = dict(zckpt.iter_tensors(dst, device=torch.device("cpu"), verify=False))
    assert all(torch.equal(again[n], ref[n]) for n in ref)


def test_torch_save_views_come_out_as_separate_copies(tmp_path):
    base = torch.arange(24, dtype=torch.float32)
    sd = {"a": base[:12].view(3, 4), "b": base[12:], "t": base[2:10:2], "tied": base[:12].view(3, 4)}
    _, dst = save_converted(sd, tmp_path, "sd")
    got = dict(zckpt.iter_tensors(dst))
    assert set(got) == set(sd)
    for n in sd:
        assert torch.equal(got[n], sd[n]) and got[n].is_contiguous(), n
    assert got["a"].data_ptr() != got["tied"].data_ptr()
    got["a"].zero_()
    assert not torch.equal(got["tied"], got["a"])


def _hf_folder(root, seed=0):
    """A sharded Hugging Face folder written by safetensors: two shards, their index, config."""
    src = root / "hf"
    src.mkdir()
    w = _weights(seed)
    names = list(w)
    shards = {"model-00001-of-00002.safetensors": names[:3], "model-00002-of-00002.safetensors": names[3:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: w[k] for k in keys}, str(src / fname))
        weight_map.update({k: fname for k in keys})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (src / "config.json").write_text("{}")
    return src, w, shards


def test_converted_folder_in_index_order(tmp_path):
    src, w, shards = _hf_folder(tmp_path)
    out = tmp_path / "out"
    _convert_cli(str(src), str(out) + "/")
    index = json.loads((out / "model.zckpt.index.json").read_text())
    files = zckpt.container_files(str(out))
    assert [os.path.basename(f) for f in files] == sorted(set(index["weight_map"].values()))
    expected = []
    for f in files:
        expected += _table_order(f)
    got = list(zckpt.iter_tensors(out))
    assert [n for n, _ in got] == expected
    assert sorted(expected) == sorted(w)
    for n, t in got:
        assert torch.equal(t, w[n]), n


def test_folder_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(zckpt.ZckptError, match="no .zckpt containers"):
        zckpt.iter_tensors(empty)
    src, _, _ = _hf_folder(tmp_path)
    out = tmp_path / "out"
    _convert_cli(str(src), str(out) + "/")
    os.remove(out / "model-00002-of-00002.zckpt")
    with pytest.raises(zckpt.ZckptError, match="model-00002-of-00002.zckpt"):
        zckpt.iter_tensors(out)


def _corrupt_tensor(dst, name):
    s = storage_of(dst, name)
    flip_byte(dst, s["offset"] + 5)


def test_corrupt_chunk_found_as_streamed(tmp_path):
    st = str(tmp_path / "model.safetensors")
    save_file(_weights(), st)
    dst = str(tmp_path / "model.zckpt")
    _convert_cli(st, dst)
    order = _table_order(dst)
    bad = order[-1]
    _corrupt_tensor(dst, bad)
    seen = []
    with pytest.raises(zckpt.CorruptError) as e:
        for name, _ in zckpt.iter_tensors(dst):
            seen.append(name)
    assert seen == order[:-1]  # lazily: the tensors before the bad one were handed out
    msg = str(e.value)
    assert dst in msg and bad in msg and "bytes [" in msg


def test_verify_first_refuses_before_the_first_tensor(tmp_path):
    src, _, _ = _hf_folder(tmp_path)
    out = tmp_path / "out"
    _convert_cli(str(src), str(out) + "/")
    files = zckpt.container_files(str(out))
    bad = _table_order(files[1])[-1]
    _corrupt_tensor(files[1], bad)
    seen = []
    with pytest.raises(zckpt.CorruptError) as e:
        for name, _ in zckpt.iter_tensors(out, verify_first=True):
            seen.append(name)
    assert seen == []
    msg = str(e.value)
    assert files[1] in msg and bad in msg and "bytes [" in msg
    # without verify_first the first file's tensors arrive before the error
    with pytest.raises(zckpt.CorruptError):
        for name, _ in zckpt.iter_tensors(out):
            seen.append(name)
    assert seen[: len(_table_order(files[0]))] == _table_order(files[0])


MEMORY_SCRIPT = textwrap.dedent("""
    import sys, torch, zckpt
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    path, mode = sys.argv[1], sys.argv[2]
    it = zckpt.iter_tensors(path)   # opened, vetted
    base = rss()
    open("/proc/self/clear_refs", "w").write("5")
    if mode == "stream":
        n = 0
        for name, t in it:
            n += t.numel()
    else:
        kept = list(it)
    print(hwm() - base)
""")


def test_memory_is_about_one_tensor(tmp_path):
    count, mib = 16, 8
    sd = {f"w{i}": torch.full((mib << 18,), float(i)) for i in range(count)}  # 8 MiB of float32 each
    _, dst = save_converted(sd, tmp_path, "big")
    del sd
    script = tmp_path / "mem.py"
    script.write_text(MEMORY_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

    def peak(mode):
        r = subprocess.run([sys.executable, str(script), dst, mode], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip().splitlines()[-1])

    streamed, kept = peak("stream"), peak("keep")
    # the consumer's previous tensor and the one being loaded, plus the ring (32 MiB here, only
    # touched for small storages) and slack: never the whole file
    assert streamed <= (2 * mib + 16) << 20, streamed
    assert kept >= (count * mib - 8) << 20, kept  # the measurement sees what a consumer keeps


def test_vllm_plugin_is_inert_without_vllm():
    import importlib.util

    import zckpt.vllm_plugin as plugin

    if importlib.util.find_spec("vllm") is None:
        assert plugin.register() is None
    expected = {"w": ("float32", (2, 3)), "b": ("float32", (3,))}
    assert plugin.update_problems(expected, dict(expected)) == []
    problems = plugin.update_problems(expected, {"w": ("bfloat16", (2, 3)), "x": ("float32", (1,))})
    assert problems == ["missing tensor 'b'", "unexpected tensor 'x'",
                        "tensor 'w' is bfloat16 [2, 3] in the update, float32 [2, 3] in the serving checkpoint"]


def test_reused_pages_never_overwrite_what_the_consumer_holds(tmp_path):
    # 1 MiB and more: the stream reuses the pages of a tensor the consumer dropped
    sd = {f"w{i}": torch.full((300_000 + 1000 * (i % 3),), float(i)) for i in range(8)}
    _, dst = save_converted(sd, tmp_path, "reuse")
    kept_views, kept_whole, ptrs = {}, {}, []
    for name, t in zckpt.iter_tensors(dst):
        ptrs.append(t.data_ptr())
        assert torch.equal(t, sd[name]), name
        if name == "w1":
            kept_views[name] = t[10:20]  # a view keeps the storage
        if name == "w4":
            kept_whole[name] = t
    assert torch.equal(kept_views["w1"], sd["w1"][10:20])
    assert torch.equal(kept_whole["w4"], sd["w4"])
    assert len(set(ptrs)) < len(ptrs)  # pages were reused for the tensors that were dropped


def test_mmap_views_checked_in_the_mapping(tmp_path):
    src, w, _ = _hf_folder(tmp_path)
    out = tmp_path / "out"
    _convert_cli(str(src), str(out) + "/")
    streamed = list(zckpt.iter_tensors(out))
    mapped = list(zckpt.iter_tensors(out, mmap=True))
    assert [n for n, _ in mapped] == [n for n, _ in streamed]
    for n, t in mapped:
        assert torch.equal(t, w[n]), n
    with pytest.raises(ValueError, match="mmap=True"):
        zckpt.iter_tensors(out, device="meta", mmap=True)
    files = zckpt.container_files(str(out))
    bad = _table_order(files[1])[-1]
    _corrupt_tensor(files[1], bad)
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.iter_tensors(out, mmap=True, verify_first=True)  # before anything is yielded
    assert files[1] in str(e.value) and bad in str(e.value)
    seen = []
    with pytest.raises(zckpt.CorruptError):
        for n, _ in zckpt.iter_tensors(out, mmap=True):  # each file checked when it is reached
            seen.append(n)
    assert seen == _table_order(files[0])
