"""The torch-free core (zckpt._core): `import zckpt` imports no torch; convert, export and verify
work in a process where torch cannot be imported; loads into host memory run on `_core` and give
what torch.load gives; both extension modules raise the same error classes."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import zckpt
import zckpt._core


# In the child, torch cannot be imported at all: a None entry in sys.modules makes every
# `import torch` raise ImportError, as where torch is not installed.
NO_TORCH = "import sys\nsys.modules['torch'] = None\n"


def _run(code, cwd, no_torch=False):
    """`code` in a fresh interpreter with this one's environment (the build on PYTHONPATH); with
    no_torch, one where torch cannot be imported."""
    code = (NO_TORCH if no_torch else "") + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


def test_import_zckpt_imports_no_torch(tmp_path):
    out = _run("""
        import sys
        import zckpt
        print('torch' in sys.modules, zckpt.CorruptError.__name__, callable(zckpt.convert))
        zckpt.load  # the first name that needs torch imports it
        print('torch' in sys.modules)
    """, tmp_path)
    assert out.split() == ["False", "CorruptError", "True", "True"]


def test_convert_verify_export_without_torch(tmp_path):
    state = {"w": torch.randn(300, 70), "b": torch.arange(10), "half": torch.randn(5, 5).half()}
    state["view"] = state["w"][2:5]
    src = tmp_path / "m.pt"
    torch.save(state, src)
    out = _run(f"""
        import zckpt
        stats = zckpt.convert({str(src)!r}, {str(tmp_path / 'm.zckpt')!r})
        print(stats["tensors"], stats["storages"])
        print(zckpt.verify({str(tmp_path / 'm.zckpt')!r}))
        zckpt.export({str(tmp_path / 'm.zckpt')!r}, {str(tmp_path / 'back.pt')!r})
        try:
            zckpt.load({str(tmp_path / 'm.zckpt')!r})
        except ImportError as e:
            print("load:", e)
        print('torch' in sys.modules and sys.modules['torch'] is not None)
    """, tmp_path, no_torch=True)
    lines = out.strip().splitlines()
    assert lines[0] == "4 3"  # the view shares w's storage
    assert lines[1] == "[]"
    assert lines[2].startswith("load: zckpt.load needs torch") and "convert, export and verify work" in lines[2]
    assert lines[3] == "False"
    back = torch.load(tmp_path / "back.pt")
    assert back.keys() == state.keys()
    for k in state:
        assert torch.equal(back[k], state[k]) and back[k].dtype == state[k].dtype
    assert back["view"].untyped_storage().data_ptr() == back["w"].untyped_storage().data_ptr()


def _payload_offset(data, tensor):
    """Where `tensor`'s bytes lie in a container's bytes (raw chunks hold them as they are)."""
    offset = data.find(tensor.numpy().tobytes()[:256])
    assert offset > 0
    return offset


def test_verify_finds_a_flipped_byte_without_torch(tmp_path):
    w = torch.randn(64, 64)
    torch.save({"w": w}, tmp_path / "m.pt")
    zckpt.convert(tmp_path / "m.pt", tmp_path / "m.zckpt")
    data = bytearray((tmp_path / "m.zckpt").read_bytes())
    info = zckpt._core.describe(str(tmp_path / "m.zckpt"))
    assert info["storages"][0]["bytes"] == 64 * 64 * 4
    offset = _payload_offset(data, w)
    data[offset + 17] ^= 0x40
    (tmp_path / "bad.zckpt").write_bytes(bytes(data))
    out = _run(f"""
        import zckpt
        try:
            zckpt.verify({str(tmp_path / 'bad.zckpt')!r})
        except zckpt.CorruptError as e:
            print(type(e).__name__, e.file, e.storage, e.chunk)
    """, tmp_path, no_torch=True)
    name, file, storage, chunk = out.split()
    assert name == "CorruptError" and file == str(tmp_path / "bad.zckpt") and storage != "None" and chunk == "0"


def test_both_modules_raise_the_same_classes(tmp_path):
    from zckpt import _C

    assert _C.ZckptError is zckpt._core.ZckptError is zckpt.ZckptError
    assert _C.CorruptError is zckpt._core.CorruptError is zckpt.CorruptError
    assert _C.UnsafeError is zckpt.UnsafeError
    assert issubclass(zckpt.OutOfMemoryError, zckpt.ZckptError)
    assert issubclass(zckpt.OutOfMemoryError, torch.OutOfMemoryError)
    with pytest.raises(zckpt.ZckptError, match="missing.zckpt") as e:
        zckpt.load(tmp_path / "missing.zckpt")
    assert e.value.file is not None or "missing.zckpt" in str(e.value)


def _equal_trees(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
        assert torch.equal(a, b)
        return
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _equal_trees(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _equal_trees(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("verify", [True, False])
def test_host_load_equals_torch_load(tmp_path, verify):
    big = torch.randn(256, 1024)  # 1 MiB: a 4 KiB-aligned HostBuffer
    state = {"big": big, "row": big[3], "t": big.t(), "small": torch.arange(7, dtype=torch.int16),
             "empty": torch.empty(0), "bf16": torch.randn(40000).bfloat16(), "nested": [{"x": torch.ones(3)}, 5]}
    torch.save(state, tmp_path / "s.pt")
    zckpt.convert(tmp_path / "s.pt", tmp_path / "s.zckpt", chunk_bytes=256 << 10)
    got = zckpt.load(tmp_path / "s.zckpt", verify=verify)
    _equal_trees(torch.load(tmp_path / "s.pt"), got)
    # views share their storage as torch.load's do; big storages are page-aligned (O_DIRECT)
    assert got["row"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()
    assert got["t"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()
    assert got["big"].data_ptr() % 4096 == 0
    got["big"].add_(1)  # writable, and the memory outlives the load's own references
    assert torch.equal(got["row"], big[3] + 1)


def test_host_load_catches_a_flipped_byte(tmp_path):
    w = torch.randn(512, 512)
    torch.save({"w": w}, tmp_path / "m.pt")
    zckpt.convert(tmp_path / "m.pt", tmp_path / "m.zckpt")
    data = bytearray((tmp_path / "m.zckpt").read_bytes())
    offset = _payload_offset(data, w)
    data[offset + 100000] ^= 1
    (tmp_path / "bad.zckpt").write_bytes(bytes(data))
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.load(tmp_path / "bad.zckpt")
    assert e.value.file == str(tmp_path / "bad.zckpt") and e.value.storage is not None
    assert e.value.storage_bytes is not None
    assert len(zckpt.load(tmp_path / "bad.zckpt", verify=False)["w"]) == 512  # unchecked, as asked


def test_load_ranges_refuses_a_range_outside_its_storage_before_any_byte_moves(tmp_path):
    torch.save({"w": torch.randn(100)}, tmp_path / "m.pt")
    zckpt.convert(tmp_path / "m.pt", tmp_path / "m.zckpt")
    ckpt = zckpt._core.open(str(tmp_path / "m.zckpt"))
    buf = zckpt._core.HostBuffer(500)
    memoryview(buf).cast("B")[:] = b"\x7f" * 500  # a ctypes array: its format is "<B"
    with pytest.raises(zckpt.ZckptError, match=r"holds 400 bytes, not the range \[0, 500\)"):
        ckpt.load_ranges([(0, 0, 400, buf.address, -1), (0, 0, 500, buf.address, -1)], {})
    assert bytes(buf) == b"\x7f" * 500  # the good range was not loaded either
    with pytest.raises(zckpt.ZckptError, match="no storage index 7"):
        ckpt.load_ranges([(7, 0, 4, buf.address, -1)], {})
    ckpt.load_ranges([(0, 0, 400, buf.address, -1)], {})
    assert bytes(buf)[:400] == torch.load(tmp_path / "m.pt")["w"].numpy().tobytes()


@pytest.mark.parametrize("zstd_level", [0, 3])
def test_mapped_load_equals_torch_load_and_outlives_everything_else(tmp_path, zstd_level):
    big = torch.arange(300000, dtype=torch.float32)
    state = {"big": big, "tail": big[-5:], "small": torch.ones(3, dtype=torch.int8), "empty": torch.empty(0)}
    torch.save(state, tmp_path / "s.pt")
    zckpt.convert(tmp_path / "s.pt", tmp_path / "s.zckpt", chunk_bytes=256 << 10, zstd_level=zstd_level)
    before = (tmp_path / "s.zckpt").read_bytes()
    got = zckpt.load(tmp_path / "s.zckpt", mmap=True)
    _equal_trees(torch.load(tmp_path / "s.pt"), got)
    assert got["tail"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()
    tail = got["tail"]
    del got
    import gc

    gc.collect()
    assert tail.tolist() == [299995.0, 299996.0, 299997.0, 299998.0, 299999.0]  # still mapped
    tail.add_(1)  # copy on write: the file never changes
    assert (tmp_path / "s.zckpt").read_bytes() == before


def test_mapped_load_catches_a_flipped_byte(tmp_path):
    w = torch.randn(512, 512)
    torch.save({"w": w}, tmp_path / "m.pt")
    zckpt.convert(tmp_path / "m.pt", tmp_path / "m.zckpt")
    data = bytearray((tmp_path / "m.zckpt").read_bytes())
    data[_payload_offset(data, w) + 70000] ^= 8
    (tmp_path / "bad.zckpt").write_bytes(bytes(data))
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.load(tmp_path / "bad.zckpt", mmap=True)
    assert e.value.file == str(tmp_path / "bad.zckpt") and e.value.chunk is not None
    assert zckpt.load(tmp_path / "bad.zckpt", mmap=True, verify=False)["w"].shape == (512, 512)


def test_the_built_package_in_a_venv_without_torch(tmp_path):
    """Not a blocked import but an environment that has no torch: a bare virtualenv of the same
    Python, the built package on its path (as an install puts it on sys.path)."""
    import venv

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    state = {"w": torch.randn(1000, 33), "i": torch.arange(5)}
    torch.save(state, tmp_path / "m.pt")
    package_root = os.path.dirname(os.path.dirname(zckpt.__file__))
    code = f"""
        import importlib.util, json, sys
        assert importlib.util.find_spec("torch") is None, "torch is importable in the bare venv"
        import zckpt
        zckpt.convert({str(tmp_path / 'm.pt')!r}, {str(tmp_path / 'm.zckpt')!r})
        assert zckpt.verify({str(tmp_path / 'm.zckpt')!r}) == []
        zckpt.export({str(tmp_path / 'm.zckpt')!r}, {str(tmp_path / 'back.pt')!r})
        try:
            zckpt.load({str(tmp_path / 'm.zckpt')!r})
            print("loaded without torch")
        except ImportError as e:
            print(e)
    """
    r = subprocess.run([str(python), "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": package_root, "PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("zckpt.load needs torch"), r.stdout
    back = torch.load(tmp_path / "back.pt")
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["i"], state["i"])


def test_save_of_host_state_runs_on_the_torch_free_core(tmp_path, monkeypatch):
    """zckpt.save of CPU tensors never reaches `_C` (its writer is made to fail), and what it
    writes is what torch.save writes: export gives a file torch.load reads back equal, with the
    same records torch's zip writer made."""
    from zckpt import _C

    def refuse(*args, **kwargs):
        raise AssertionError("_C.save_pickled called for host storages")

    monkeypatch.setattr(_C, "save_pickled", refuse)
    w = torch.randn(300, 300)
    state = {"w": w, "t": w.t(), "i": torch.arange(4), "step": 7, "empty": torch.empty(0, 3)}
    stats = zckpt.save(state, tmp_path / "s.zckpt", metadata={"run": "r1"})
    assert stats["storages"] == 3 and stats["tensors"] == 4
    assert zckpt.verify(tmp_path / "s.zckpt") == []
    zckpt.export(tmp_path / "s.zckpt", tmp_path / "back.pt")
    torch.save(state, tmp_path / "ref.pt")
    _equal_trees(torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "back.pt"))
    import zipfile

    with zipfile.ZipFile(tmp_path / "back.pt") as a, zipfile.ZipFile(tmp_path / "ref.pt") as b:
        names = lambda z: [n.split("/", 1)[1] for n in z.namelist()]  # noqa: E731 (prefixes differ)
        assert names(a) == names(b)
        for ours, theirs in zip(a.namelist(), b.namelist()):
            if ours.endswith(("data.pkl", "/version", "byteorder", ".format_version")):
                assert a.read(ours) == b.read(theirs), ours
    fut = zckpt.async_save(state, tmp_path / "a.zckpt")
    assert fut.result(timeout=60)["tensors"] == 4
    _equal_trees(zckpt.load(tmp_path / "a.zckpt", weights_only=False), zckpt.load(tmp_path / "s.zckpt"))


def test_cpu_paths_never_import_libzckpt(tmp_path):
    """In a process where zckpt._C cannot be imported (as under a torch it was not built for),
    every CPU path works from the torch-free core and gives what torch gives: load (streamed and
    mapped), load_into of a module, a state dict with views and an optimizer, iter_tensors (plain,
    verify_first, mmap), save and async_save, and _C is still never imported."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    w = torch.randn(200, 300)
    state = {"model": model.state_dict(), "w": w, "wt": w.t(), "rows": w[5:9], "i": torch.arange(7),
             "c": torch.randn(40, dtype=torch.complex64).conj(), "bf": torch.randn(33).bfloat16(),
             "empty": torch.empty(0, 3)}
    torch.save(state, tmp_path / "s.pt")
    torch.save(opt.state_dict(), tmp_path / "o.pt")
    zckpt.convert(tmp_path / "s.pt", tmp_path / "s.zckpt")
    zckpt.convert(tmp_path / "o.pt", tmp_path / "o.zckpt")
    out = _run(f"""
        import sys
        sys.modules['zckpt._C'] = None  # `from . import _C` raises ImportError
        import torch, zckpt
        d = {str(tmp_path)!r}
        ref = torch.load(d + '/s.pt')

        def same(a, b):
            return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.resolve_conj(), b.resolve_conj())

        for mmap in (False, True):
            got = zckpt.load(d + '/s.zckpt', mmap=mmap)
            assert all(same(got[k], ref[k]) for k in ('w', 'wt', 'rows', 'i', 'c', 'bf', 'empty')), mmap
            assert got['wt'].untyped_storage().data_ptr() == got['w'].untyped_storage().data_ptr()
            assert got['c'].is_conj()

        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 8))
        ptrs = [p.data_ptr() for p in model.parameters()]
        versions = [p._version for p in model.parameters()]
        missing, unexpected = zckpt.load_into(d + '/s.zckpt', {{'model.' + k: v for k, v in model.state_dict(keep_vars=True).items()}}, strict=False)
        assert missing == [] and sorted(unexpected) == ['bf', 'c', 'empty', 'i', 'rows', 'w', 'wt'], unexpected
        assert [p.data_ptr() for p in model.parameters()] == ptrs
        assert all(v > v0 for v, v0 in zip([p._version for p in model.parameters()], versions))
        assert all(same(v, ref['model'][k]) for k, v in model.state_dict().items())

        target = {{'w': torch.zeros(200, 300), 'wt': torch.zeros(300, 200), 'rows': torch.zeros(4, 300),
                   'c': torch.zeros(40, dtype=torch.complex64), 'i': torch.zeros(7, dtype=torch.int64),
                   'bf': torch.zeros(33, dtype=torch.bfloat16), 'empty': torch.zeros(0, 3)}}
        target['wt'] = torch.zeros(200, 300).t()  # a non-contiguous target: staged, then copied
        zckpt.load_into(d + '/s.zckpt', target, strict=False)
        assert all(same(target[k], ref[k]) for k in target), [k for k in target if not same(target[k], ref[k])]

        opt = torch.optim.Adam(model.parameters(), lr=5.0)
        model(torch.randn(4, 64)).sum().backward()
        opt.step()
        zckpt.load_into(d + '/o.zckpt', opt)
        want = torch.load(d + '/o.pt')
        assert opt.param_groups[0]['lr'] == 1e-3
        for i, p in enumerate(model.parameters()):
            assert same(opt.state[p]['exp_avg'], want['state'][i]['exp_avg'])

        for kw in ({{}}, {{'verify_first': True}}, {{'mmap': True}}):
            got = dict(zckpt.iter_tensors(d + '/s.zckpt', **kw))
            assert set(got) == set(ref) - {{'model'}} | {{'model.' + k for k in ref['model']}}, kw
            assert all(same(got[k], ref[k]) for k in ('w', 'wt', 'rows', 'i', 'c', 'bf', 'empty')), kw
            assert got['wt'].is_contiguous() or kw.get('mmap')

        zckpt.save(ref, d + '/again.zckpt')
        zckpt.async_save(ref, d + '/async.zckpt').result(timeout=60)
        for name in ('again', 'async'):
            back = zckpt.load(d + '/' + name + '.zckpt')
            assert all(same(back[k], ref[k]) for k in ('w', 'wt', 'rows', 'c', 'bf')), name
        print('zckpt._C' in sys.modules and sys.modules['zckpt._C'] is not None, type(zckpt.OutOfMemoryError.__mro__[2]).__name__)
    """, tmp_path)
    assert out.split()[0] == "False"


def test_fsdp1_load_into_never_imports_libzckpt(tmp_path):
    """FSDP1's load_into (element runs straight into the FlatParameter shard, the module's other
    state through load_into) on the torch-free core: a one-rank gloo group in a process where
    zckpt._C cannot be imported; the module's parameters afterwards are the saved ones, the
    FlatParameter's memory is the one it had."""
    out = _run(f"""
        import sys
        sys.modules['zckpt._C'] = None
        import torch, torch.distributed as dist, zckpt
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
        d = {str(tmp_path)!r}
        dist.init_process_group("gloo", init_method="file://" + d + "/pg", rank=0, world_size=1)

        def model(seed):
            torch.manual_seed(seed)
            m = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.LayerNorm(48), torch.nn.Linear(48, 4))
            m.register_buffer("steps", torch.tensor([seed]))
            return FSDP(m, device_id=torch.device("cpu"))

        saved = model(0)
        with FSDP.state_dict_type(saved, StateDictType.SHARDED_STATE_DICT):
            torch.save(saved.state_dict(), d + "/model_world_size_1_rank_0.pt")
        zckpt.convert(d + "/model_world_size_1_rank_0.pt", d + "/model_world_size_1_rank_0.zckpt")
        live = model(1)
        flat = [p for p in live.parameters()]
        ptrs = [p.data_ptr() for p in flat]
        missing, unexpected = zckpt.load_into(d + "/model_world_size_1_rank_0.zckpt", live)
        assert (missing, unexpected) == ([], []), (missing, unexpected)
        assert [p.data_ptr() for p in live.parameters()] == ptrs
        with FSDP.summon_full_params(saved), FSDP.summon_full_params(live):
            for (n, a), (_, b) in zip(saved.named_parameters(), live.named_parameters()):
                assert torch.equal(a, b), n
        assert int(live.module.steps) == 0
        dist.destroy_process_group()
        print('zckpt._C' in sys.modules and sys.modules['zckpt._C'] is not None)
    """, tmp_path)
    assert out.split()[-1] == "False"


def test_dcp_and_reshard_never_import_libzckpt(tmp_path):
    """In a process where zckpt._C cannot be imported, zckpt.dcp saves and loads through
    torch.distributed.checkpoint (one process, no process group) and gives back what was saved:
    transposed and conj views and a tensor larger than one write piece (written in host pieces),
    a non-contiguous destination and several staging passes (staged reads), bf16, ints, BytesIO
    items; `zckpt merge` of that folder holds the full tensors; zckpt.reshard takes verl FSDP2
    files of 2 ranks to 1 and 3. _C is never imported."""
    out = _run(f"""
        import sys
        sys.modules['zckpt._C'] = None  # `from . import _C` raises ImportError
        import torch
        import torch.distributed.checkpoint as dcp
        import zckpt
        from zckpt import _core, _load_ranges, _writer
        from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter
        d = {str(tmp_path)!r}
        _writer.PIECE_BYTES = 4096  # small pieces and passes, so small tensors take those paths
        _load_ranges.STAGED_BYTES_PER_PASS = 8192

        torch.manual_seed(0)
        w = torch.randn(300, 70)
        saved = {{"w": w, "wt": w.t(), "rows": w[5:9], "i": torch.arange(7), "bf": torch.randn(33).bfloat16(),
                  "c": torch.randn(40, dtype=torch.complex64).conj(), "empty": torch.empty(0, 3),
                  "extra": {{"step": 7, "note": "dcp"}}}}
        dcp.save(saved, storage_writer=ZckptStorageWriter(d + "/dcp", chunk_bytes=4096))

        def fresh():
            out = {{k: torch.zeros_like(v) for k, v in saved.items() if isinstance(v, torch.Tensor)}}
            out["wt"] = torch.zeros(300, 70).t()  # a non-contiguous destination: staged, then copied
            out["extra"] = {{"step": 0, "note": ""}}
            return out

        back = fresh()
        ptrs = {{k: v.data_ptr() for k, v in back.items() if isinstance(v, torch.Tensor)}}
        reader = ZckptStorageReader(d + "/dcp")
        dcp.load(back, storage_reader=reader)
        for k, v in saved.items():
            if isinstance(v, torch.Tensor):
                assert back[k].data_ptr() == ptrs[k], k
                assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
                assert torch.equal(back[k].resolve_conj(), v.resolve_conj()), k
        assert back["extra"] == saved["extra"], back["extra"]
        assert reader.last_read["regions"] >= 6, reader.last_read  # the empty one may plan no read

        stats = _core.merge(d + "/dcp", d + "/merged.zckpt")
        merged = zckpt.load(d + "/merged.zckpt")
        for k in ("w", "wt", "rows", "i", "bf", "c"):
            assert torch.equal(merged[k].resolve_conj(), saved[k].resolve_conj()), k

        from torch.distributed.tensor import DeviceMesh, DTensor, Shard
        from zckpt.reshard import _FakeGroup, reshard
        import os
        os.makedirs(d + "/verl")
        full = torch.randn(10, 6)
        for r in range(2):
            with _FakeGroup(r, 2):
                mesh = DeviceMesh("cpu", torch.arange(2))
                dt = DTensor.from_local(full.chunk(2)[r].clone(), mesh, [Shard(0)], run_check=False,
                                        shape=full.shape, stride=full.stride())
                torch.save({{"w": dt, "step": 3}}, d + f"/verl/model_world_size_2_rank_{{r}}.pt")
        for world in (1, 3):
            reshard(d + "/verl", world, d + f"/r{{world}}", log=lambda *a: None)
            parts = []
            for r in range(world):
                with _FakeGroup(r, world):
                    got = zckpt.load(d + f"/r{{world}}/model_world_size_{{world}}_rank_{{r}}.zckpt", weights_only=False)
                    assert got["step"] == 3
                    parts.append(got["w"].to_local().clone())
            assert torch.equal(torch.cat(parts), full), world
        print('zckpt._C' in sys.modules and sys.modules['zckpt._C'] is not None)
    """, tmp_path)
    assert out.split()[-1] == "False"


@pytest.mark.parametrize("version", ["2.3.1+cu121", "1.13.1", "nightly"])
def test_a_torch_older_than_the_oldest_supported_is_refused_naming_both(tmp_path, version):
    """The first name that needs torch, under a torch older than 2.4 (a stand-in module with that
    __version__), raises ImportError naming both versions; the torch-free calls still work."""
    out = _run(f"""
        import sys, types
        sys.modules['torch'] = types.SimpleNamespace(__version__={version!r}, __file__='/old/torch/__init__.py')
        import zckpt
        print(callable(zckpt.verify))
        try:
            zckpt.load
        except ImportError as e:
            print(e)
    """, tmp_path)
    first, message = out.strip().splitlines()
    assert first == "True"
    assert f"torch {version} is installed" in message and "needs torch 2.4 or newer" in message, message


def test_torch_release_reads_versions():
    assert zckpt._torch_release("2.4.1+cu121") == (2, 4)
    assert zckpt._torch_release("2.15.0") == (2, 15)
    assert zckpt._torch_release("2.10.0a0+git1234") == (2, 10)
    assert zckpt._torch_release("garbage") == (0, 0)
