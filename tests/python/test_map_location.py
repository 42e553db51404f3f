"""zckpt.load's map_location in every form torch.load accepts: a string, a torch.device, a dict
of location renames and a callable; checked against torch.load with the same argument.

cuda_shard.pt (from the torch family) is a CPU-made file whose storages say `cuda:0`, as a
shard saved from a GPU does."""
import pytest
import torch

import zckpt
from torch_family import assert_deep_equal
from zckpt_testing import ls_json, rewrite_pickle, storage_ptrs


def _devices(obj):
    return {t.device.type for t in obj.values()}


@pytest.mark.parametrize("map_location", ["cpu", torch.device("cpu"), {"cuda:1": "cpu"}],
                         ids=["str", "device", "dict-unused"])
def test_cpu_file(family, map_location):
    got = zckpt.load(family.zckpt("shared_storage.pt"), map_location=map_location, weights_only=False)
    assert_deep_equal(got, family.torch_load("shared_storage.pt", map_location=map_location))


@pytest.mark.parametrize("map_location", ["cpu", torch.device("cpu"), {"cuda:0": "cpu"}],
                         ids=["str", "device", "dict"])
def test_cuda_located_file_to_cpu(family, map_location):
    got = zckpt.load(family.zckpt("cuda_shard.pt"), map_location=map_location, weights_only=True)
    want = family.torch_load("cuda_shard.pt", map_location=map_location, weights_only=True)
    assert_deep_equal(got, want)
    assert _devices(got) == {"cpu"}
    assert got["w_t"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()


def test_locations_patched_into_the_pickle(tmp_path):
    """A cuda:0 file made without torch's help: the location strings of a torch.save pickle
    rewritten (protocol 2: BINUNICODE with its length, no frames), zipped again STORED."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5, 3, generator=g)
    saved = {"w": w, "w_t": w.t(), "ids": torch.arange(7), "half": torch.randn(4, generator=g).half()}
    src, pt = str(tmp_path / "cpu.pt"), str(tmp_path / "cuda.pt")
    torch.save(saved, src)
    cpu, cuda = b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0"

    def patch(pkl):
        assert pkl.count(cpu) == 1  # later uses are memo references
        return pkl.replace(cpu, cuda)

    rewrite_pickle(src, pt, patch)
    dst = str(tmp_path / "cuda.zckpt")
    zckpt.convert(pt, dst)
    assert {s["location"] for s in ls_json(dst)["storages"]} == {"cuda:0"}
    want = torch.load(pt, map_location={"cuda:0": "cpu"}, weights_only=True)
    got = zckpt.load(dst, map_location={"cuda:0": "cpu"}, weights_only=True)
    assert_deep_equal(got, want)
    assert_deep_equal(got, saved)
    seen = []
    zckpt.load(dst, map_location=lambda s, loc: seen.append(loc) or s, weights_only=True)
    assert set(seen) == {"cuda:0"}


def test_storage_locations_are_kept_by_convert(family):
    info = ls_json(family.zckpt("cuda_shard.pt"))
    assert {s["location"] for s in info["storages"]} == {"cuda:0"}


def test_callable_sees_storage_and_saved_location(family):
    seen = []

    def keep(storage, location):
        seen.append((type(storage), storage.device.type, location))
        return storage

    got = zckpt.load(family.zckpt("cuda_shard.pt"), map_location=keep, weights_only=False)
    assert_deep_equal(got, family.torch_load("cuda_shard.pt", map_location=lambda storage, loc: storage))
    assert _devices(got) == {"cpu"}
    assert seen and set(seen) == {(torch.UntypedStorage, "cpu", "cuda:0")}


def test_callable_identity_on_cpu_file(family):
    got = zckpt.load(family.zckpt("strides.pt"), map_location=lambda storage, loc: storage, weights_only=False)
    assert_deep_equal(got, family.torch_load("strides.pt", map_location=lambda storage, loc: storage))


def test_callable_called_once_per_storage(family):
    """torch.load calls map_location once per storage (then reuses the result for every tensor
    of that storage); shared_storage.pt has 3 storages under 9 tensor references."""
    calls = {"torch": 0, "zckpt": 0}

    def counting(who):
        def f(storage, location):
            calls[who] += 1
            return storage
        return f

    family.torch_load("shared_storage.pt", map_location=counting("torch"))
    zckpt.load(family.zckpt("shared_storage.pt"), map_location=counting("zckpt"), weights_only=False)
    assert calls["torch"] == 3
    assert calls["zckpt"] == calls["torch"]


@pytest.mark.parametrize("name", ["shared_storage.pt", "legacy.pt"])
def test_copying_callable_keeps_aliasing(family, name):
    """A callable that returns a new storage (as a device move does) must still give views of
    one storage one storage, as torch.load does."""
    def copy(storage, location):
        return storage.clone()

    got = zckpt.load(family.zckpt(name), map_location=copy, weights_only=False)
    want = family.torch_load(name, map_location=copy)
    assert len(storage_ptrs(got)) == len(storage_ptrs(want))
    assert_deep_equal(got, want)


def test_cuda_location_without_cuda_is_an_error(family):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: a cuda:0 storage loads as saved")
    with pytest.raises(RuntimeError):
        family.torch_load("cuda_shard.pt", map_location=None)
    with pytest.raises(RuntimeError):
        zckpt.load(family.zckpt("cuda_shard.pt"), weights_only=False)


def test_bad_map_location_type(family):
    with pytest.raises(TypeError, match="map_location"):
        zckpt.load(family.zckpt("strides.pt"), map_location=3.5, weights_only=False)


def _assert_same_on_device(got, want, device):
    """deep_equal reads storages on the host; on CUDA compare tensor by tensor instead."""
    assert list(got) == list(want)
    for k in want:
        g, w = got[k], want[k]
        assert g.device == w.device == torch.device(device), k
        assert (g.dtype, g.shape, g.stride(), g.storage_offset()) == (w.dtype, w.shape, w.stride(), w.storage_offset())
        assert torch.equal(g.cpu(), w.cpu()), k


@pytest.mark.parametrize("map_location", ["cuda:0", torch.device("cuda:0"), None], ids=["str", "device", "as-saved"])
def test_to_cuda(family, needs_cuda, map_location):
    got = zckpt.load(family.zckpt("cuda_shard.pt"), map_location=map_location, weights_only=False)
    _assert_same_on_device(got, family.torch_load("cuda_shard.pt", map_location=map_location), "cuda:0")
    assert got["w_t"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()


def test_dict_to_cuda(family, needs_cuda):
    got = zckpt.load(family.zckpt("strides.pt"), map_location={"cpu": "cuda:0"}, weights_only=False)
    _assert_same_on_device(got, family.torch_load("strides.pt", map_location={"cpu": "cuda:0"}), "cuda:0")
