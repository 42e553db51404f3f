"""zckpt.patch_torch_load: torch.load of a .pt reads the .zckpt converted from it (beside it or
in a mapped folder) through zckpt.load with the same arguments, and is torch.load otherwise."""
import io
import os
import pickle

import pytest
import torch

import zckpt
from zckpt_testing import Config, save_converted


@pytest.fixture
def patched():
    calls = []
    zckpt.patch_torch_load(log=lambda pt, z: calls.append((pt, z)))
    try:
        yield calls
    finally:
        zckpt.unpatch_torch_load()


def _state():
    return {"w": torch.arange(12.0).reshape(3, 4), "step": torch.tensor(7)}


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_reads_the_container_beside_the_pt(tmp_path, patched):
    pt, z = save_converted(_state(), tmp_path, "model_world_size_2_rank_1")
    got = torch.load(pt, map_location="cpu")
    assert _equal(got, _state())
    assert patched == [(pt, z)]


def test_no_container_is_plain_torch_load(tmp_path, patched):
    pt = os.path.join(tmp_path, "plain.pt")
    torch.save(_state(), pt)
    assert _equal(torch.load(pt), _state())
    buf = io.BytesIO()
    torch.save(_state(), buf)
    buf.seek(0)
    assert _equal(torch.load(buf), _state())  # a file object: torch's
    assert patched == []


def test_container_older_than_its_pt_is_not_used(tmp_path, patched):
    pt, _ = save_converted(_state(), tmp_path, "m")
    newer = {"w": torch.zeros(5)}
    torch.save(newer, pt)  # the .pt was rewritten after conversion
    with pytest.warns(UserWarning, match="older than, or not converted from"):
        got = torch.load(pt)
    assert _equal(got, newer)
    assert patched == []


def test_mapped_folder(tmp_path, patched):
    src, dst = tmp_path / "pt", tmp_path / "z" / "actor"
    os.makedirs(src / "actor")
    os.makedirs(dst)
    pt = str(src / "actor" / "optim.pt")
    torch.save(_state(), pt)
    zckpt.convert(pt, str(dst / "optim.zckpt"))
    zckpt.patch_torch_load(folders={str(src): str(tmp_path / "z")}, log=lambda p, z: patched.append(z))
    assert _equal(torch.load(pt), _state())
    assert patched == [str(dst / "optim.zckpt")]


def test_weights_only_is_torch_loads(tmp_path, patched):
    obj = {"cfg": Config("x", 2), "w": torch.ones(2)}
    pt, _ = save_converted(obj, tmp_path, "cfg", allow_globals=[Config])
    # A class of the caller's own: zckpt's vetting refuses it unless the patch is told to allow
    # it, whatever weights_only says (never a silent fall back to torch.load of the .pt).
    with pytest.raises(zckpt.UnsafeError, match=r"zckpt_testing\.Config"):
        torch.load(pt, weights_only=False)
    zckpt.patch_torch_load(log=lambda p, z: patched.append((p, z)), allow_globals=[Config])
    with pytest.raises(pickle.UnpicklingError):
        torch.load(pt)  # weights_only defaults to True, as torch.load's
    got = torch.load(pt, weights_only=False)
    assert got["cfg"] == Config("x", 2) and torch.equal(got["w"], torch.ones(2))
    assert len(patched) == 3


def test_mmap_and_map_location_pass_through(tmp_path, patched):
    pt, _ = save_converted(_state(), tmp_path, "m")
    got = torch.load(pt, mmap=True, map_location="cpu")
    assert _equal(got, _state())
    assert len(patched) == 1


def test_unpatch_and_context_manager(tmp_path):
    original = torch.load
    pt, z = save_converted(_state(), tmp_path, "m")
    seen = []
    with zckpt.torch_load_from_zckpt(log=lambda p, c: seen.append(c)):
        assert torch.load is not original
        torch.load(pt)
    assert torch.load is original
    assert seen == [z]
    zckpt.patch_torch_load()
    zckpt.unpatch_torch_load()
    zckpt.unpatch_torch_load()  # twice is harmless
    assert torch.load is original


def _same_as_torch(got, want):
    """Same keys, and each tensor of torch's own kind: device, dtype, shape, and (off meta) values."""
    assert got.keys() == want.keys()
    for k in want:
        g, w = got[k], want[k]
        assert (g.device, g.dtype, g.shape) == (w.device, w.dtype, w.shape), k
        if w.device.type != "meta":
            assert torch.equal(g, w), k


@pytest.mark.parametrize("map_location", [
    None, "cpu", torch.device("cpu"), "meta", torch.device("meta"), {"cpu": "meta"}, {"cpu": "cpu"},
    lambda storage, loc: storage, lambda storage, loc: torch.UntypedStorage(storage.nbytes(), device="meta"), lambda storage, loc: None,
], ids=["none", "str", "device", "meta", "meta-device", "dict-meta", "dict-cpu", "callable", "callable-meta",
        "callable-none"])
def test_every_map_location_behaves_as_torch_loads(tmp_path, patched, map_location):
    # transformers' from_pretrained of a pytorch_model.bin folder loads with map_location="meta"
    # when config.json names no dtype: that failed under the patch ("cannot load to device meta").
    pt, z = save_converted(_state(), tmp_path, "pytorch_model")
    want = zckpt._patch._original(pt, map_location=map_location, weights_only=True)
    got = torch.load(pt, map_location=map_location, weights_only=True)
    assert patched == [(pt, z)]  # read from the container, not a fall back
    _same_as_torch(got, want)


def test_fallbacks_are_counted_told_and_raised_when_strict(tmp_path):
    pt, z = save_converted(_state(), tmp_path, "m")
    os.utime(z, (1, 1))  # a copy without timestamps: the .pt now looks newer than its container
    seen = []
    zckpt.reset_patch_stats()
    import warnings

    with zckpt.torch_load_from_zckpt(on_fallback=lambda p, c, why: seen.append((p, c, why))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PYTHONWARNINGS=ignore: the callback and count still say it
            assert _equal(torch.load(pt), _state())
    assert seen and seen[0][:2] == (pt, z) and "older than" in seen[0][2]
    assert zckpt.patch_stats() == {"redirected": 0, "fallbacks": 1}
    with zckpt.torch_load_from_zckpt(strict=True):
        with pytest.raises(zckpt.ZckptError, match="not used for torch.load"):
            torch.load(pt)
    os.utime(z, None)
    with zckpt.torch_load_from_zckpt(strict=True):
        assert _equal(torch.load(pt), _state())
    assert zckpt.patch_stats() == {"redirected": 1, "fallbacks": 2}
