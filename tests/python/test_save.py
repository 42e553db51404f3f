"""zckpt.save, zckpt.async_save and zckpt::Save against torch.save.

For every object of the torch family (tests/fixtures/torch_family.py) the container zckpt.save
writes is held against torch.save of the same object: its kept pickle is torch.save's data.pkl
byte for byte; it is the container `zckpt convert` makes of that torch.save file (same listing:
storages, tensor records with their views, flags and extras, blobs, zckpt.source.* metadata, and
the same data region byte for byte but for torch's random serialization id); and zckpt.load,
the C++ object tree and `zckpt export` + torch.load all give back what torch.load of the
torch.save file gives (deep-equal: values bit for bit, views, which tensors share a storage or
are the same object). Then aliasing, options, atomicity, the background save and the C++ API.
"""
import collections
import os
import subprocess
import sys
import threading
import time
import zipfile

import pytest
import torch

import torch_family
import zckpt
import zckpt_testing
from test_cpp_tree import deep_recursion, opaque_described, project, sets_sorted  # noqa: F401 (fixture)
from torch_family import assert_deep_equal, diff
from zckpt import _C, _core

NAMES = [f.name for f in torch_family.FAMILY]
# Load refuses quantized tensors (LoadStorages + torch's unpickler rebuild them): no C++ tree.
NO_TREE = {"quantized.pt"}


class Saved:
    """One family object written both ways: `pt` by torch.save (zip, the fixture's pickle
    protocol), `converted` = zckpt convert of it, `saved` = zckpt.save of the object."""

    def __init__(self, root, name):
        fixture = torch_family.BY_NAME[name]
        why = fixture.needs()
        if why:
            pytest.skip(why)
        self.obj = fixture.build()
        protocol = fixture.save_kwargs.get("pickle_protocol", torch.serialization.DEFAULT_PROTOCOL)
        stem = os.path.splitext(name)[0]
        os.makedirs(os.path.join(root, "pt"), exist_ok=True)
        os.makedirs(os.path.join(root, "saved"), exist_ok=True)
        self.pt = os.path.join(root, "pt", stem + ".pt")
        torch.save(self.obj, self.pt, pickle_protocol=protocol)
        self.converted = os.path.join(root, "pt", stem + ".zckpt")
        zckpt.convert(self.pt, self.converted)
        self.saved = os.path.join(root, "saved", stem + ".zckpt")
        self.stats = zckpt.save(self.obj, self.saved, pickle_protocol=protocol)

    def torch_load(self, path=None):
        return torch.load(path or self.pt, weights_only=False)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("save"))
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = Saved(root, name)
        return cache[name]

    return get


def _pt_record(path, name):
    with zipfile.ZipFile(path) as z:
        prefix = z.infolist()[0].filename.split("/", 1)[0]
        return z.read(f"{prefix}/{name}")


@pytest.mark.parametrize("name", NAMES)
def test_pickle_is_torch_saves(saved, name):
    s = saved(name)
    assert _C.read_blob(s.saved, "data.pkl") == _pt_record(s.pt, "data.pkl")


def _listing_without_source_file(path):
    info = zckpt_testing.ls_json(path)
    for key in ("file", "bytes"):  # the file's name and size (its index holds more metadata)
        info.pop(key)
    for key in ("zckpt.source.name", "zckpt.source.bytes"):  # there is no source file to name
        info["metadata"].pop(key, None)
    return info


def _data_region(path, info):
    """The file's bytes up to the end of its last storage or blob, the serialization id (a
    random number torch's zip writer draws) zeroed."""
    ends = [s["offset"] + s["bytes"] for s in info["storages"]] + [b["offset"] + b["bytes"] for b in info["blobs"]]
    with open(path, "rb") as f:
        data = bytearray(f.read(max(ends)))
    for b in info["blobs"]:
        if b["name"] == ".data/serialization_id":
            data[b["offset"]:b["offset"] + b["bytes"]] = bytes(b["bytes"])
    return bytes(data)


@pytest.mark.parametrize("name", NAMES)
def test_container_is_what_convert_makes(saved, name):
    s = saved(name)
    mine, theirs = _listing_without_source_file(s.saved), _listing_without_source_file(s.converted)
    assert mine == theirs
    assert _data_region(s.saved, mine) == _data_region(s.converted, theirs)
    meta = _C.describe(s.saved)["metadata"]
    assert "zckpt.source.name" not in meta and "zckpt.source.bytes" not in meta
    assert meta["zckpt.source.format"] == "zip"


@pytest.mark.parametrize("name", NAMES)
def test_loads_equal_torch_load(saved, name, deep_recursion):  # noqa: F811
    s = saved(name)
    expected = s.torch_load()
    assert_deep_equal(zckpt.load(s.saved, map_location="cpu", weights_only=False), expected)
    exported = s.saved + ".pt"
    zckpt.export(s.saved, exported)
    assert_deep_equal(s.torch_load(exported), expected)
    if name not in NO_TREE:
        projected = project(expected)
        d = diff(sets_sorted(opaque_described(_C.load_tree(s.saved)), projected), projected)
        assert d is None, d


def test_the_comparison_has_teeth(saved):
    """The container check sees a changed tensor record and a changed storage byte."""
    s = saved("shared_storage.pt")
    info = _listing_without_source_file(s.saved)
    info["tensors"][1]["storage_offset"] += 1
    assert info != _listing_without_source_file(s.converted)
    region = bytearray(_data_region(s.saved, _listing_without_source_file(s.saved)))
    storage = _listing_without_source_file(s.saved)["storages"][0]
    region[storage["offset"]] ^= 1
    assert bytes(region) != _data_region(s.converted, _listing_without_source_file(s.converted))


def test_weights_only_load_and_stats(tmp_path):
    sd = torch_family._module_state_dict()
    path = tmp_path / "model.zckpt"
    stats = zckpt.save(sd, path)
    assert stats["destination"] == str(path)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in sd.values()}
    assert len(storages) == len(sd) - 1  # the tied head/embedding weights: one storage
    assert stats["tensors"] == len(sd) and stats["storages"] == len(storages)
    assert stats["raw_bytes"] == sum(storages.values())
    assert_deep_equal(zckpt.load(path), sd)  # weights_only=True: a state dict needs nothing else
    assert zckpt.verify(path) == []
    assert _C.describe(str(path))["metadata"]["zckpt.source.prefix"] == "model"


# ----- aliasing ------------------------------------------------------------------------------


def test_tied_weights_are_one_storage_and_views_share(tmp_path):
    net, _, _ = torch_family._trained_net()
    sd = net.state_dict()  # tied: head.weight and embed.weight, two tensors over one storage
    base = torch.arange(24.0).reshape(4, 6)
    obj = {"model": sd, "base": base, "row": base[2], "col": base[:, 1], "tail": base.view(-1)[7:]}
    path = tmp_path / "tied.zckpt"
    zckpt.save(obj, path)
    info = zckpt_testing.ls_json(str(path))
    by_name = {t["name"]: t for t in info["tensors"]}
    assert by_name["model.embed.weight"]["storage"] == by_name["model.head.weight"]["storage"]
    assert {by_name[n]["storage"] for n in ("base", "row", "col", "tail")} == {by_name["base"]["storage"]}
    assert by_name["tail"]["storage_offset"] == 7 and by_name["col"]["stride"] == [6]
    got = zckpt.load(path)
    tied = [got["model"][n].untyped_storage().data_ptr() for n in ("embed.weight", "head.weight")]
    assert tied[0] == tied[1]
    ptr = got["base"].untyped_storage().data_ptr()
    assert all(got[n].untyped_storage().data_ptr() == ptr for n in ("row", "col", "tail"))
    assert_deep_equal(got, obj)
    got["base"][2, 0] = 100.0
    assert got["row"][0] == 100.0  # a view, not a copy
    w = torch.ones(3)
    same = zckpt.load(_saved_to(tmp_path / "same.zckpt", {"a": w, "b": w}))
    assert same["a"] is same["b"]  # one tensor saved twice comes back as one object, as torch.load gives


def _saved_to(path, obj):
    zckpt.save(obj, path)
    return path


# ----- options -------------------------------------------------------------------------------


def test_chunk_size_zstd_and_threads(tmp_path):
    obj = torch_family._compressible()
    for threads in (1, 2):
        path = tmp_path / f"c{threads}.zckpt"
        stats = zckpt.save(obj, path, chunk_bytes=64 * 1024, zstd_level=3, threads=threads)
        info = zckpt_testing.ls_json(str(path))
        assert info["chunk_bytes"] == 64 * 1024
        assert stats["chunks"] == info["chunks"]["count"] == 32 + 1  # 2 MiB in 64 KiB chunks + the small one
        assert 0 < stats["compressed_chunks"] == info["chunks"]["zstd"]
        assert stats["file_bytes"] < 1 << 20  # mostly zeros: zstd pays
        assert zckpt.verify(path) == []
        assert_deep_equal(zckpt.load(path), obj)
    raw = zckpt.save(obj, tmp_path / "raw.zckpt")
    assert raw["compressed_chunks"] == 0 and raw["file_bytes"] > 2 << 20  # off by default


def test_bad_options(tmp_path):
    obj = {"w": torch.ones(3)}
    for kwargs in ({"chunk_bytes": -1}, {"threads": -2}, {"zstd_level": 1.5}):
        with pytest.raises(ValueError):
            zckpt.save(obj, tmp_path / "x.zckpt", **kwargs)
    with pytest.raises(zckpt.ZckptError, match="zstd_level"):
        zckpt.save(obj, tmp_path / "x.zckpt", zstd_level=99)
    with pytest.raises(zckpt.ZckptError, match="chunk"):
        zckpt.save(obj, tmp_path / "x.zckpt", chunk_bytes=100)
    with pytest.raises(TypeError, match="paths"):
        zckpt.save(obj, open(os.devnull, "wb"))
    assert os.listdir(tmp_path) == []


def test_metadata(tmp_path):
    path = tmp_path / "m.zckpt"
    zckpt.save({"w": torch.ones(2)}, path, metadata={"step": "1200", "run": "ü"})
    meta = _C.describe(str(path))["metadata"]
    assert meta["step"] == "1200" and meta["run"] == "ü"
    with pytest.raises(zckpt.ZckptError, match="reserved"):
        zckpt.save({"w": torch.ones(2)}, tmp_path / "r.zckpt", metadata={"zckpt.source.name": "x"})
    assert not (tmp_path / "r.zckpt").exists()


# ----- atomicity -----------------------------------------------------------------------------


def test_unpicklable_object_leaves_nothing(tmp_path):
    path = tmp_path / "bad.zckpt"
    with pytest.raises(Exception):  # pickle's own error, as torch.save raises it
        zckpt.save({"w": torch.ones(2), "f": lambda x: x}, path)
    assert os.listdir(tmp_path) == []


def test_one_storage_under_two_dtypes_is_refused_like_torch_save(tmp_path):
    t = torch.arange(4, dtype=torch.float32)
    obj = {"f": t, "i": t.view(torch.int32)}
    with pytest.raises(RuntimeError) as theirs:
        torch.save(obj, tmp_path / "t.pt")
    with pytest.raises(RuntimeError) as mine:
        zckpt.save(obj, tmp_path / "t.zckpt")
    assert str(mine.value) == str(theirs.value)
    assert not (tmp_path / "t.zckpt").exists()


def test_missing_directory_names_the_path(tmp_path):
    path = tmp_path / "no" / "such" / "dir.zckpt"
    with pytest.raises(zckpt.ZckptError, match=str(path)):
        zckpt.save({"w": torch.ones(2)}, path)


FAILING_WRITE = r"""
import os, resource, signal, sys, torch, zckpt
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # write(2) then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    zckpt.save({"w": torch.ones(4 << 20, dtype=torch.uint8)}, sys.argv[1])
except zckpt.ZckptError as e:
    print("ERROR", e)
    sys.exit(3)
"""


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    """A save that fails half-way (the file size limit makes write(2) fail at 1 MiB) raises,
    naming the file, leaves the previous checkpoint as it was and removes its temporary."""
    path = tmp_path / "ckpt.zckpt"
    old = {"w": torch.arange(10)}
    zckpt.save(old, path)
    before = zckpt_testing.sha256(path)
    p = subprocess.run([sys.executable, "-c", FAILING_WRITE, str(path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "ERROR" in p.stdout and str(path) in p.stdout
    assert os.listdir(tmp_path) == ["ckpt.zckpt"]
    assert zckpt_testing.sha256(path) == before
    assert_deep_equal(zckpt.load(path), old)


# ----- async_save ----------------------------------------------------------------------------


@pytest.fixture
def held_writes(monkeypatch):
    """Background writes wait until `release()`: a test can act while a write is pending. The
    write of a snapshot (host memory) is the torch-free core's."""
    gate = threading.Event()
    started = threading.Event()
    real = _core.save_pickled

    def held(*args, **kwargs):
        started.set()
        assert gate.wait(60), "test never released the write"
        return real(*args, **kwargs)

    monkeypatch.setattr(_core, "save_pickled", held)
    yield gate, started
    gate.set()


def test_async_save_round_trip(tmp_path):
    saver = zckpt.AsyncSaver()
    sd = torch_family._optimizer_state()
    fut = saver.save(sd, tmp_path / "opt.zckpt")
    stats = fut.result(timeout=60)
    assert stats["tensors"] > 0
    assert_deep_equal(zckpt.load(tmp_path / "opt.zckpt", weights_only=False), sd)
    # The same container zckpt.save writes (data region byte for byte, but the serialization id).
    zckpt.save(sd, tmp_path / "sync.zckpt")
    a, b = (_listing_without_source_file(str(tmp_path / n)) for n in ("opt.zckpt", "sync.zckpt"))
    a["metadata"].pop("zckpt.source.prefix"), b["metadata"].pop("zckpt.source.prefix")
    assert a == b
    saver.close()
    assert saver.buffer_bytes == 0


def test_async_snapshot_is_not_changed_by_later_mutation(tmp_path, held_writes):
    gate, started = held_writes
    w = torch.arange(1 << 16, dtype=torch.float32)
    obj = {"w": w, "view": w[10:20], "step": 5, "nested": {"b": torch.ones(3)}}
    w0 = w.clone()
    expected = {"w": w0, "view": w0[10:20], "step": 5, "nested": {"b": torch.ones(3)}}
    saver = zckpt.AsyncSaver()
    fut = saver.save(obj, tmp_path / "snap.zckpt")
    assert started.wait(60)
    assert not fut.done()
    # What training does right after: in-place updates, new entries, rebinding.
    w.mul_(-1)
    obj["nested"]["b"].zero_()
    obj["step"] = 6
    obj["extra"] = torch.zeros(2)
    gate.set()
    fut.result(timeout=60)
    assert_deep_equal(zckpt.load(tmp_path / "snap.zckpt"), expected)
    saver.close()


def test_async_errors_surface_on_the_future(tmp_path):
    saver = zckpt.AsyncSaver()
    path = tmp_path / "missing" / "x.zckpt"
    fut = saver.save({"w": torch.ones(3)}, path)  # returns: the snapshot was taken
    with pytest.raises(zckpt.ZckptError, match=str(path)):
        fut.result(timeout=60)
    # The saver goes on working after a failed write.
    ok = saver.save({"w": torch.ones(3)}, tmp_path / "ok.zckpt")
    assert ok.result(timeout=60)["tensors"] == 1
    # A snapshot error (an unpicklable object) is raised by the call itself.
    with pytest.raises(Exception):
        saver.save({"f": lambda: 0}, tmp_path / "f.zckpt")
    assert sorted(os.listdir(tmp_path)) == ["ok.zckpt"]
    saver.close()


def test_async_second_save_waits_for_the_first(tmp_path, held_writes):
    gate, started = held_writes
    saver = zckpt.AsyncSaver()
    first = saver.save({"w": torch.ones(4)}, tmp_path / "1.zckpt")
    assert started.wait(60)
    second = []
    t = threading.Thread(target=lambda: second.append(saver.save({"w": torch.zeros(4)}, tmp_path / "2.zckpt")))
    t.start()
    t.join(0.5)
    assert t.is_alive() and not second and not first.done()  # blocked behind the first write
    gate.set()
    t.join(60)
    assert first.result(timeout=60) and second[0].result(timeout=60)
    assert first.done()
    assert torch.equal(zckpt.load(tmp_path / "2.zckpt")["w"], torch.zeros(4))
    saver.close()


def test_async_buffer_is_bounded_and_reused(tmp_path):
    saver = zckpt.AsyncSaver()
    obj = {"a": torch.ones(1000), "b": torch.ones(3, dtype=torch.float64), "a_view": None}
    obj["a_view"] = obj["a"][5:]
    saver.save(obj, tmp_path / "1.zckpt").result(timeout=60)
    size = saver.buffer_bytes
    assert size == 4032 + 64  # one copy of each storage (the view adds none), each rounded up to 64
    ptr = saver._buffer.data_ptr()
    saver.save(obj, tmp_path / "2.zckpt").result(timeout=60)
    assert saver.buffer_bytes == size and saver._buffer.data_ptr() == ptr  # reused, not reallocated
    saver.save({"small": torch.ones(2)}, tmp_path / "3.zckpt").result(timeout=60)
    assert saver._buffer.data_ptr() == ptr
    saver.close()


def test_async_save_module_function(tmp_path):
    fut = zckpt.async_save({"w": torch.arange(5)}, tmp_path / "f.zckpt")
    assert fut.result(timeout=60)["tensors"] == 1
    assert torch.equal(zckpt.load(tmp_path / "f.zckpt")["w"], torch.arange(5))


# ----- zckpt::Save (C++ trainers) ------------------------------------------------------------


def _cpp_tensors():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 4, generator=g)
    return [("layers.0.w", w), ("tied", w), ("w_t", w.t()), ("row", w[2]), ("bf16", torch.randn(5, generator=g).bfloat16()),
            ("step", torch.tensor(7)), ("empty", torch.zeros(0, 3, dtype=torch.int32)),
            ("grad", torch.ones(2, requires_grad=True))]


def test_cpp_save_round_trips(tmp_path):
    tensors = _cpp_tensors()
    expected = dict(tensors)
    path = str(tmp_path / "cpp.zckpt")
    stats = _C.save_tensors(path, tensors, {"step": "7"})
    assert stats["tensors"] == len(tensors) and stats["storages"] == 5
    assert zckpt.verify(path) == []
    assert _C.describe(path)["metadata"]["step"] == "7"
    assert_deep_equal(zckpt.load(path), expected)  # weights_only=True: a plain dict of tensors
    zckpt.export(path, str(tmp_path / "cpp.pt"))
    assert_deep_equal(torch.load(tmp_path / "cpp.pt"), expected)
    d = diff(opaque_described(_C.load_tree(path)), project(expected))
    assert d is None, d
    info = zckpt_testing.ls_json(path)
    names = [t["name"] for t in info["tensors"]]
    assert names == [n for n, _ in tensors]  # the dict's order, names as given


def test_cpp_save_refuses(tmp_path):
    path = str(tmp_path / "bad.zckpt")
    t = torch.arange(4.0)
    cases = [
        ([("a", t), ("a", t)], {}, "twice"),
        ([("f", t), ("i", t.view(torch.int32))], {}, "different dtypes"),
        ([("s", torch.eye(3).to_sparse())], {}, "dense strided"),
        ([("m", torch.empty(2, device="meta"))], {}, "dense strided"),
        ([("a", t)], {"zckpt.x": "1"}, "reserved"),
    ]
    for tensors, meta, words in cases:
        with pytest.raises(zckpt.ZckptError, match=words):
            _C.save_tensors(path, tensors, meta)
    assert os.listdir(tmp_path) == []


# ----- CUDA ----------------------------------------------------------------------------------


def test_save_from_cuda_goes_through_the_ring(tmp_path, needs_cuda):
    g = torch.Generator().manual_seed(0)
    cpu = {"big": torch.randn(5 << 20, generator=g), "small": torch.arange(10), "cpu_too": torch.ones(3)}
    obj = {k: (v.cuda() if k != "cpu_too" else v) for k, v in cpu.items()}
    obj["view"] = obj["big"][100:200]
    path = tmp_path / "cuda.zckpt"
    stats = zckpt.save(obj, path, chunk_bytes=1 << 20)
    assert stats["cuda_bytes"] == (5 << 22) + 80
    assert stats["cuda_ring_bytes"] == 4 * (8 << 20)  # the ring, not a whole-tensor copy
    info = _C.describe(str(path))
    assert {s["location"] for s in info["storages"]} == {"cuda:0", "cpu"}
    got = zckpt.load(path, map_location="cpu")
    for k, v in cpu.items():
        assert torch.equal(got[k], v)
    assert_deep_equal(zckpt.load(path), torch.load(_exported(path)))


def _exported(path):
    out = str(path) + ".pt"
    zckpt.export(path, out)
    return out


def test_async_save_from_cuda_uses_pinned_snapshot(tmp_path, needs_cuda):
    saver = zckpt.AsyncSaver()
    w = torch.randn(1 << 20, device="cuda")
    expected = w.cpu()
    fut = saver.save({"w": w}, tmp_path / "a.zckpt")
    w.zero_()  # after the call returns: must not reach the file
    fut.result(timeout=60)
    assert saver._buffer.is_pinned()
    assert torch.equal(zckpt.load(tmp_path / "a.zckpt", map_location="cpu")["w"], expected)
    saver.close()
