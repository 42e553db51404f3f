"""Object folders, s3://BUCKET/PREFIX/ (issue 25), where the Python layer takes a local folder:
zckpt.iter_tensors / container_files over a converted Hugging Face folder, listings of many
pages, torch.distributed.checkpoint through ZckptStorageWriter / ZckptStorageReader, FSDP1
load_into of verl's per-rank files, reshard's refusal. Against the moto server and fault proxy
of test_object_storage.py; every check compares values (tensors, items) with the local run's."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

import fsdp_cases
import zckpt
import zckpt.dcp
import zckpt_testing
from test_object_storage import BUCKET, byte_range, moto, proxy, s3env  # noqa: F401  (fixtures)
from zckpt import _C, _iter, _paths

# A folder name with a space and an '&': both must survive signing and listing.
ODD = "odd name & co"


def upload(local, url):
    """Every file below `local` as an object below `url` (one PUT each); returns the names."""
    names = sorted(_paths.files_under(local))
    for name in names:
        _C.write_object(f"{url}/{name}", _paths.read_bytes(os.path.join(local, name)))
    return names


def hf_sharded(root):
    """A sharded Hugging Face folder, three safetensors shards and their index, the tensors
    spread so that shard order, not name order, decides the iteration order."""
    g = torch.Generator().manual_seed(7)
    w = {f"layers.{i}.weight": torch.randn(64, 33, generator=g) for i in range(6)}
    w["embed.weight"] = torch.randn(300, 16, generator=g).to(torch.bfloat16)
    w["norm.bias"] = torch.arange(40, dtype=torch.int32)
    shards = {"model-00001-of-00003.safetensors": ["layers.5.weight", "norm.bias", "layers.0.weight"],
              "model-00002-of-00003.safetensors": ["embed.weight", "layers.3.weight"],
              "model-00003-of-00003.safetensors": ["layers.1.weight", "layers.2.weight", "layers.4.weight"]}
    src = os.path.join(root, "hf")
    os.makedirs(src)
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: w[k] for k in keys}, os.path.join(src, fname))
        weight_map.update({k: fname for k in keys})
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    with open(os.path.join(src, "config.json"), "w") as f:
        f.write("{}")
    return src, w


def assert_streams_equal(got, want):
    assert [n for n, _ in got] == [n for n, _ in want]
    for (n, a), (_, b) in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), n


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("hf"))
    src, w = hf_sharded(root)
    out = os.path.join(root, "converted")
    r = zckpt_testing.run_cli("convert", src, "-o", out + "/")
    assert r.returncode == 0, r.stdout + r.stderr
    return out, w


def test_iter_tensors_over_an_object_folder_equals_the_local_folder(s3env, proxy, converted):
    out, w = converted
    url = f"s3://{BUCKET}/{ODD}/hf-converted"
    names = upload(out, url)
    assert "model.zckpt.index.json" in names and "config.json" in names
    local_files = zckpt.container_files(out)
    remote_files = zckpt.container_files(url)
    assert [_paths.basename(f) for f in remote_files] == [os.path.basename(f) for f in local_files] == [
        "model-00001-of-00003.zckpt", "model-00002-of-00003.zckpt", "model-00003-of-00003.zckpt"]
    assert all(f.startswith(url + "/") for f in remote_files)
    want = list(zckpt.iter_tensors(out))
    proxy.reset()
    got = list(zckpt.iter_tensors(url))
    assert_streams_equal(got, want)
    assert sorted(n for n, _ in got) == sorted(w)
    for n, t in got:
        assert torch.equal(t, w[n]), n
    # The shards' own order: shard 1's tensors first, whatever their names.
    assert {n for n, _ in got[:3]} == {"layers.5.weight", "norm.bias", "layers.0.weight"}
    # Read through ranged GETs of the containers, never a whole-object GET of one.
    gets = [(p, r) for m, p, r in proxy.log if m == "GET" and ".zckpt?" not in p and p.endswith(".zckpt")]
    assert gets and all(r for _, r in gets), gets
    assert _iter.tensor_table(url) == _iter.tensor_table(out)
    # verify_first and a trailing '/' give the same.
    assert_streams_equal(list(zckpt.iter_tensors(url + "/", verify_first=True)), want)


def test_a_shard_the_index_names_missing_from_the_object_folder(s3env, moto, converted):
    out, _ = converted
    url = f"s3://{BUCKET}/{ODD}/hf-missing"
    upload(out, url)
    moto.request("DELETE", f"/{BUCKET}/{ODD.replace(' ', '%20').replace('&', '%26')}/hf-missing/"
                 "model-00002-of-00003.zckpt")
    assert not _C.object_exists(f"{url}/model-00002-of-00003.zckpt")
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.iter_tensors(url)
    assert "model-00002-of-00003.zckpt" in str(e.value) and "model.zckpt.index.json" in str(e.value), str(e.value)
    assert "model-00001-of-00003.zckpt" not in str(e.value).split("names shards")[-1]


def test_a_folder_of_many_listing_pages(s3env, proxy, monkeypatch, tmp_path):
    monkeypatch.setenv("ZCKPT_S3_LIST_KEYS", "2")
    url = f"s3://{BUCKET}/{ODD}/paged"
    want = []
    for i in range(7):
        sd = {f"t{i}": torch.full((100 + i,), float(i)), f"ids{i}": torch.arange(i + 1)}
        local = str(tmp_path / f"part{i}.zckpt")
        zckpt.save(sd, local)
        _C.write_object(f"{url}/part{i}.zckpt", _paths.read_bytes(local))
        want += list(zckpt.iter_tensors(local))
    _C.write_object(f"{url}/notes.txt", b"not a container")
    _C.write_object(f"{url}/sub/part9.zckpt", _paths.read_bytes(local))  # below a sub-folder: not listed as ours
    proxy.reset()
    files = zckpt.container_files(url)
    assert [_paths.basename(f) for f in files] == [f"part{i}.zckpt" for i in range(7)]
    listings = [p for m, p, _ in proxy.log if m == "GET" and "list-type=2" in p]
    assert len(listings) >= 5, listings  # 9 keys, 2 a page
    assert any("continuation-token=" in p for p in listings), listings
    assert_streams_equal(list(zckpt.iter_tensors(url)), want)
    assert _paths.listdir(url) == sorted([f"part{i}.zckpt" for i in range(7)] + ["notes.txt", "sub"])


# --- the vLLM load format, through a stand-in for vLLM's BaseModelLoader -----------------------

class _StandInBase:
    def __init__(self, load_config):
        self.load_config = load_config


class _StandInModel:
    """What vLLM's model.load_weights does with the iterator: takes every tensor (a copy)."""

    def __init__(self):
        self.weights = {}

    def load_weights(self, weights):
        for n, t in weights:
            self.weights[n] = t.clone()
        return set(self.weights)

    def named_parameters(self):
        return iter(())


def test_vllm_loader_reads_an_object_folder_opening_each_file_once(s3env, proxy, converted, tmp_path):
    from types import SimpleNamespace

    from zckpt import vllm_plugin

    out, w = converted
    url = f"s3://{BUCKET}/{ODD}/vllm"
    upload(out, url)
    loader = vllm_plugin._loader_class(_StandInBase)(SimpleNamespace(model_loader_extra_config={}))
    config = SimpleNamespace(model=url, model_weights="", quantization=None)
    model = _StandInModel()
    proxy.reset()
    loader.load_weights(model, config)  # mmap's default is off for an object (it cannot be mapped)
    # One question, one request: a HEAD (is the URL an object?), one listing of the folder.
    assert [p for m, p, _ in proxy.log if m == "HEAD"] == [f"/{BUCKET}/{ODD}/vllm".replace(" ", "%20").replace(
        "&", "%26")], proxy.log
    assert len([p for m, p, _ in proxy.log if m == "GET" and "list-type=2" in p]) == 1, proxy.log
    assert sorted(model.weights) == sorted(w)
    for n, t in w.items():
        assert torch.equal(model.weights[n], t), n
    # The reload path: table checked and tensors streamed from one open of each file.
    proxy.reset()
    update = loader.get_all_weights(config, model)
    got = [(n, t.clone()) for n, t in update]
    assert_streams_equal(got, list(zckpt.iter_tensors(out)))
    # An open is a HEAD or (issue 34) a first GET of the object's start.
    heads = [p.split("?")[0].rsplit("/", 1)[-1] for m, p, r in proxy.log
             if m == "HEAD" or (m == "GET" and (r or "").startswith("bytes=0-"))]
    containers = [h for h in heads if h.endswith(".zckpt")]
    assert sorted(containers) == [f"model-0000{i}-of-00003.zckpt" for i in (1, 2, 3)], heads
    # An update of other tensors is refused before anything is streamed.
    other = str(tmp_path / "other.zckpt")
    zckpt.save({"layers.0.weight": torch.zeros(64, 33)}, other)
    _C.write_object(f"s3://{BUCKET}/{ODD}/vllm-other/other.zckpt", _paths.read_bytes(other))
    with pytest.raises(ValueError, match="cannot update the serving weights"):
        loader.get_all_weights(SimpleNamespace(model=url, model_weights=f"s3://{BUCKET}/{ODD}/vllm-other/",
                                               quantization=None), model)


def test_vllm_pull_of_the_side_files_leaves_the_containers(s3env, proxy, converted, tmp_path, monkeypatch):
    """vLLM's pull of an s3:// model's config and tokenizer files (ObjectStorageModel.pull_files)
    through the plugin's hook: *.zckpt left out with the other weight files; with Run:ai's S3
    package, Run:ai's pull; without, zckpt's own: one listing and one GET a file."""
    from types import SimpleNamespace

    from zckpt import vllm_plugin

    out, _ = converted
    url = f"s3://{BUCKET}/{ODD}/vllm-pull"
    names = upload(out, url)
    _C.write_object(f"{url}/sub/tokenizer.model", b"tok")
    weights = ["*.pt", "*.safetensors", "*.bin", "*.tensors", "*.pth"]  # vLLM's ignore_pattern
    runai = []
    pull = vllm_plugin._pull_files_hook(lambda *a: runai.append(a))
    monkeypatch.setattr(vllm_plugin, "_runai_s3_installed", lambda: True)
    pull(SimpleNamespace(dir="d"), url, None, weights)
    assert runai == [(SimpleNamespace(dir="d"), url, None, weights + ["*.zckpt"])]
    monkeypatch.setattr(vllm_plugin, "_runai_s3_installed", lambda: False)
    for allow, ignore, want in ((["*.model", "*.py", "*.json"], None,
                                 sorted([n for n in names if n.endswith(".json")] + ["sub/tokenizer.model"])),
                                (None, weights, sorted([n for n in names if not n.endswith(".zckpt")] +
                                                       ["sub/tokenizer.model"]))):
        dst = tmp_path / f"pulled-{len(os.listdir(tmp_path))}"
        proxy.reset()
        pull(SimpleNamespace(dir=str(dst)), url, allow, ignore)
        got = sorted(os.path.relpath(os.path.join(r, f), dst) for r, _, fs in os.walk(dst) for f in fs)
        assert got == want, got
        for n in got:
            if n in names:
                assert (dst / n).read_bytes() == _paths.read_bytes(os.path.join(out, n)), n
        methods = [m for m, p, _ in proxy.log]
        assert methods.count("HEAD") == 0 and len([p for m, p, _ in proxy.log if "list-type=2" in p]) == 1, proxy.log
        assert len([p for m, p, _ in proxy.log if ".zckpt" in p and "list-type" not in p
                    and not p.endswith(".json")]) == 0, proxy.log


# --- torch.distributed.checkpoint ------------------------------------------------------------------

def _dcp_state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"model": {"embed.weight": torch.randn(200, 64, generator=g),
                      "head.weight": torch.randn(33, 64, generator=g).to(torch.bfloat16),
                      "head.bias": torch.randn(33, generator=g)},
            "extra": {"step": seed, "note": f"run {seed}", "lrs": [0.1 * seed, 0.2]}}


def _flat(state):
    import object_folder_workers

    return object_folder_workers.flat_items(state)


def _assert_state_equal(got, want):
    import object_folder_workers

    problem = object_folder_workers.compare(_flat(got), _flat(want), "state")
    assert problem is None, problem


def _rank0_failure(fn):
    """The exception rank 0 raised inside dcp.save/load (DCP hands it over wrapped in a
    CheckpointException, a BaseException)."""
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as e:
        fn()
    failure = e.value.failures[0]
    return failure[0] if isinstance(failure, tuple) else failure


def _dcp_save(state, path, **kw):
    import torch.distributed.checkpoint as dcp

    from zckpt.dcp import ZckptStorageWriter

    dcp.save(state, storage_writer=ZckptStorageWriter(path, chunk_bytes=4096, **kw), no_dist=True)


def _dcp_load(path, seed=99):
    import torch.distributed.checkpoint as dcp

    from zckpt.dcp import ZckptStorageReader

    state = _dcp_state(seed)
    reader = ZckptStorageReader(path)
    dcp.load(state, storage_reader=reader, no_dist=True)
    return state, reader


def test_dcp_save_and_load_in_an_object_folder(s3env, proxy, moto, tmp_path):
    from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter

    url = f"s3://{BUCKET}/{ODD}/dcp/step_100"
    assert ZckptStorageWriter.validate_checkpoint_id(url)
    assert not ZckptStorageWriter.validate_checkpoint_id("gs://b/x")
    saved = _dcp_state(1)
    proxy.reset()
    _dcp_save(saved, url)
    # The container is written straight to the bucket, .metadata after it, one PUT.
    writes = [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _ in proxy.log if m in ("PUT", "POST")]
    assert writes[-1] == ("PUT", ".metadata"), writes
    assert ("PUT", "__0_0.zckpt") in writes, writes
    assert sorted(_paths.listdir(url)) == [".metadata", "__0_0.zckpt"]
    assert ZckptStorageReader.validate_checkpoint_id(url)
    assert not ZckptStorageReader.validate_checkpoint_id(f"s3://{BUCKET}/{ODD}/dcp/no_such_step")
    got, reader = _dcp_load(url)
    _assert_state_equal(got, saved)
    assert reader.last_read["files"] == [f"{url}/__0_0.zckpt"]
    # The same checkpoint saved locally loads to the same state; a trailing '/' is the same folder.
    local = str(tmp_path / "step_100")
    _dcp_save(saved, local)
    _assert_state_equal(_dcp_load(local)[0], got)
    _assert_state_equal(_dcp_load(url + "/")[0], saved)
    remote_md, local_md = zckpt.dcp.load_metadata(url), zckpt.dcp.load_metadata(local)
    assert remote_md.state_dict_metadata == local_md.state_dict_metadata
    # overwrite=False: the .metadata object is a checkpoint that exists; nothing is written.
    proxy.reset()
    e = _rank0_failure(lambda: _dcp_save(_dcp_state(2), url, overwrite=False))
    assert isinstance(e, RuntimeError) and "already exists" in str(e) and url in str(e), repr(e)
    assert not [m for m, _, _ in proxy.log if m in ("PUT", "POST")], proxy.log
    _assert_state_equal(_dcp_load(url)[0], saved)
    fresh = f"s3://{BUCKET}/{ODD}/dcp/step_200"
    _dcp_save(_dcp_state(2), fresh, overwrite=False)
    _assert_state_equal(_dcp_load(fresh)[0], _dcp_state(2))


def test_dcp_load_from_an_object_folder_refetches_a_damaged_chunk(s3env, proxy, tmp_path):
    local = str(tmp_path / "ckpt")
    saved = _dcp_state(3)
    _dcp_save(saved, local)
    url = f"s3://{BUCKET}/{ODD}/dcp-damaged"
    upload(local, url)
    at = zckpt_testing.storage_of(os.path.join(local, "__0_0.zckpt"), "model.embed.weight")["offset"] + 5000
    flipped = []

    def once(method, path, headers, n):
        if n >= 1 and path.endswith("__0_0.zckpt") and not flipped:
            lo, hi = byte_range(headers["Range"])
            if lo <= at < hi:
                flipped.append((lo, hi))
                return ("flip", at - lo)
        return None

    proxy.reset(once)
    got, _ = _dcp_load(url)
    assert flipped, "no ranged GET held the byte: the test damaged nothing"
    _assert_state_equal(got, saved)
    again = [r for m, p, r in proxy.log if m == "GET" and r and p.endswith("__0_0.zckpt") and byte_range(r)[0] <= at
             < byte_range(r)[1]]
    assert len(again) >= 2, proxy.log  # the damaged range was asked for again

    def always(method, path, headers, n):
        if n >= 1 and path.endswith("__0_0.zckpt"):
            lo, hi = byte_range(headers["Range"])
            if lo <= at < hi:
                return ("flip", at - lo)
        return None

    proxy.reset(always)
    e = _rank0_failure(lambda: _dcp_load(url))
    msg = str(e)
    assert isinstance(e, zckpt.CorruptError), repr(e)
    assert f"{url}/__0_0.zckpt" in msg and "model.embed.weight" in msg and "4 fetches" in msg, msg


def test_dcp_converted_filesystemwriter_folder_read_from_an_object_folder(s3env, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    saved = _dcp_state(4)
    fs = str(tmp_path / "fs")
    dcp.save(saved, storage_writer=FileSystemWriter(fs), no_dist=True)
    conv = str(tmp_path / "conv")
    r = zckpt_testing.run_cli("convert", fs, "-o", conv)
    assert r.returncode == 0, r.stdout + r.stderr
    url = f"s3://{BUCKET}/{ODD}/dcp-converted"
    names = upload(conv, url)
    assert ".metadata" in names and any(n.endswith(".zckpt") for n in names), names
    got, reader = _dcp_load(url)
    _assert_state_equal(got, saved)
    assert reader.last_read["files"] and all(f.startswith(url + "/") for f in reader.last_read["files"])
    _assert_state_equal(_dcp_load(conv)[0], got)
    # A container the metadata names, missing from the folder: named, not a wrong read.
    missing = f"s3://{BUCKET}/{ODD}/dcp-converted-missing"
    for n in names:
        if not n.endswith(".zckpt"):
            _C.write_object(f"{missing}/{n}", _paths.read_bytes(os.path.join(conv, n)))
    e = _rank0_failure(lambda: _dcp_load(missing))
    assert isinstance(e, zckpt.ZckptError) and "missing" in str(e) and f"{missing}/" in str(e), repr(e)


# --- two gloo ranks: DCP with FSDP2 state, FSDP1 load_into of verl's per-rank files -------------

@pytest.fixture(scope="module")
def ranks(s3_for_module, proxy, tmp_path_factory):
    import object_folder_workers

    root = str(tmp_path_factory.mktemp("ranks"))
    dcp_url = f"s3://{BUCKET}/{ODD}/ranks/dcp"
    fsdp_url = f"s3://{BUCKET}/{ODD}/ranks/fsdp1"
    proxy.reset()
    out = fsdp_cases.spawn(object_folder_workers.worker, 2, (root, dcp_url, fsdp_url), timeout=300)
    return out, dcp_url, fsdp_url, list(proxy.log)


@pytest.fixture(scope="module")
def s3_for_module(proxy):
    """s3env for a module-scoped fixture: the spawned ranks inherit this environment."""
    mp = pytest.MonkeyPatch()
    proxy.reset()
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        mp.delenv(k, raising=False)
    for k, v in {"AWS_ENDPOINT_URL": proxy.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_REGION": "us-east-1", "ZCKPT_S3_BACKOFF": "0.01", "ZCKPT_S3_ATTEMPTS": "4",
                 "ZCKPT_S3_TIMEOUT": "10", "ZCKPT_S3_PART_MB": "5"}.items():
        mp.setenv(k, v)
    yield
    mp.undo()


def _rank_checks(ranks, prefix, at_least):
    out = ranks[0]
    assert sorted(out) == [0, 1], f"ranks that reported: {sorted(out)}"
    for rank, results in out.items():
        assert "worker raised" not in results, results["worker raised"]
    checks = {(r, k): v for r, res in out.items() for k, v in res.items() if k.startswith(prefix)}
    assert len(checks) >= at_least, sorted(checks)
    failed = {k: v for k, v in checks.items() if v is not None}
    assert not failed, "\n".join(f"rank {r}: {k}: {v}" for (r, k), v in failed.items())


def test_dcp_two_ranks_save_and_load_through_an_object_folder(ranks):
    _rank_checks(ranks, "dcp", 2 * 9)
    _, dcp_url, _, log = ranks
    assert _paths.listdir(dcp_url) == [".metadata", "__0_0.zckpt", "__1_0.zckpt"]
    # Both ranks' containers were complete in the bucket before the one PUT of .metadata.
    prefix = "/" + BUCKET + "/" + ODD.replace(" ", "%20").replace("&", "%26") + "/ranks/dcp/"
    writes = [(m, p.split("?")[0][len(prefix):]) for m, p, _ in log if m in ("PUT", "POST") and p.startswith(prefix)]
    assert [w for w in writes if w[1] == ".metadata"] == [("PUT", ".metadata")], writes
    last_container = max(i for i, (_, name) in enumerate(writes) if name.endswith(".zckpt"))
    assert writes.index(("PUT", ".metadata")) > last_container, writes
    assert {name for _, name in writes if name.endswith(".zckpt")} == {"__0_0.zckpt", "__1_0.zckpt"}, writes


def test_fsdp1_load_into_from_an_object_folder_equals_local(ranks):
    _rank_checks(ranks, "fsdp1", 2 * 9)
    fsdp_url = ranks[2]
    assert _paths.listdir(fsdp_url) == sorted(f"{k}_world_size_2_rank_{r}.zckpt" for k in ("model", "optim")
                                              for r in (0, 1))


# --- reshard ----------------------------------------------------------------------------------------

def test_reshard_refuses_object_folders_by_name(tmp_path):
    from zckpt import reshard

    url = f"s3://{BUCKET}/verl/step_1"
    with pytest.raises(ValueError, match="reads a local checkpoint folder, not an object folder"):
        reshard.reshard(url, 2, str(tmp_path / "out"))
    with pytest.raises(ValueError, match="writes a local folder, not an object folder"):
        reshard.reshard(str(tmp_path), 2, url)
    assert not os.path.exists("s3:")  # never taken as a relative local path
    r = zckpt_testing.run_cli("reshard", url, "--world-size", "2", "-o", str(tmp_path / "o2"))
    assert r.returncode == 2 and "not an object folder" in r.stderr, r.stdout + r.stderr
    shutil.rmtree(tmp_path / "o2", ignore_errors=True)
