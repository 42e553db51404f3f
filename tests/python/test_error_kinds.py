"""Each kind of include/zckpt/error.h reaches Python as its own ZckptError subclass, with `kind`
(error.h's name) and the place attributes, through real calls on files written here: a missing
file (IoError, also an OSError), a file that is not a container (NotAContainerError), a container
safetensors cannot express (UnsupportedError), an export format that does not exist
(InvalidArgumentError, also a ValueError), damaged bytes (CorruptError). The tests' `_C` raises
the same classes. `verify_first` reports each damaged chunk with its own place."""
import os

import pytest
import torch

import zckpt
from zckpt_testing import flip_byte, save_converted, storage_of

PLACE = ("file", "storage", "tensors", "chunk", "file_bytes", "storage_bytes")


def test_every_class_has_its_kind_and_the_place_attributes():
    classes = {zckpt.IoError: "io", zckpt.NotAContainerError: "not-a-container", zckpt.CorruptError: "corrupt",
               zckpt.UnsupportedError: "unsupported", zckpt.UnsafeError: "unsafe",
               zckpt.InvalidArgumentError: "invalid-argument", zckpt.CancelledError: "cancelled",
               zckpt.OutOfMemoryError: "out-of-memory"}
    for cls, kind in classes.items():
        assert issubclass(cls, zckpt.ZckptError) and cls.kind == kind, cls
        assert cls.__module__ == "zckpt" and all(getattr(cls, f) is None for f in PLACE), cls
    assert zckpt.ZckptError.kind is None  # raised by the Python layer as none of error.h's kinds
    assert issubclass(zckpt.IoError, OSError) and issubclass(zckpt.InvalidArgumentError, ValueError)


def test_a_missing_file_is_an_io_error(tmp_path):
    missing = str(tmp_path / "missing.zckpt")
    for call in (lambda: zckpt.verify(missing), lambda: zckpt.load(missing), lambda: zckpt.export(missing, missing + ".pt")):
        with pytest.raises(zckpt.IoError) as e:
            call()
        assert isinstance(e.value, OSError) and e.value.kind == "io", repr(e.value)
        assert missing in str(e.value), str(e.value)
    with pytest.raises(OSError):  # what `except OSError` around a load sees
        zckpt.load(missing)


def test_a_file_that_is_no_container_is_not_a_container(tmp_path):
    junk = tmp_path / "junk.zckpt"
    junk.write_bytes(os.urandom(64 << 10))
    with pytest.raises(zckpt.NotAContainerError) as e:
        zckpt.verify(junk)
    assert e.value.kind == "not-a-container" and str(junk) in str(e.value) and not isinstance(e.value, OSError)
    pt = tmp_path / "m.pt"
    torch.save({"w": torch.arange(4.0)}, pt)
    with pytest.raises(zckpt.NotAContainerError, match="convert it first"):
        zckpt.load(pt)


def test_what_safetensors_cannot_hold_is_unsupported(tmp_path):
    _, path = save_converted({"w": torch.arange(6.0), "step": 3}, tmp_path, "m")
    with pytest.raises(zckpt.UnsupportedError, match="cannot be written as safetensors") as e:
        zckpt.export(path, tmp_path / "m.safetensors")
    assert e.value.kind == "unsupported" and path in str(e.value)
    assert not (tmp_path / "m.safetensors").exists()


def test_an_export_format_that_does_not_exist_is_an_invalid_argument(tmp_path):
    _, path = save_converted({"w": torch.arange(6.0)}, tmp_path, "m")
    with pytest.raises(zckpt.InvalidArgumentError, match="'onnx'") as e:
        zckpt.export(path, tmp_path / "m.onnx", format="onnx")
    assert isinstance(e.value, ValueError) and e.value.kind == "invalid-argument"


def test_the_tests_module_raises_the_same_classes(tmp_path):
    from zckpt import _C

    with pytest.raises(zckpt.IoError) as e:
        _C.describe(str(tmp_path / "missing.zckpt"))
    assert e.value.kind == "io"
    junk = tmp_path / "junk.zckpt"
    junk.write_bytes(os.urandom(64 << 10))
    with pytest.raises(zckpt.NotAContainerError, match="not a zckpt container"):
        _C.describe(str(junk))


def _two_damaged_tensors(tmp_path):
    """A container whose tensors 'a' and 'c' each have one flipped byte: (path, {name: flipped offset})."""
    g = torch.Generator().manual_seed(0)
    state = {name: torch.randn(64, 256, generator=g) for name in ("a", "b", "c")}  # 64 KiB storages
    _, path = save_converted(state, tmp_path, "m")
    flipped = {}
    for name in ("a", "c"):
        flipped[name] = storage_of(path, name)["offset"] + 1000
        flip_byte(path, flipped[name])
    return path, flipped


def test_verify_first_gives_each_problem_with_its_place(tmp_path):
    path, flipped = _two_damaged_tensors(tmp_path)
    with pytest.raises(zckpt.CorruptError) as e:
        next(zckpt.iter_tensors(path, verify_first=True))
    err = e.value
    assert "2 problem(s)" in str(err) and len(err.problems) == 2, str(err)
    for problem, name in zip(err.problems, ("a", "c")):
        assert problem["kind"] == "corrupt" and problem["file"] == path and problem["tensors"] == [name], problem
        assert problem["storage"] == storage_of(path, name)["key"] and isinstance(problem["chunk"], int), problem
        begin, end = problem["file_bytes"]
        assert begin <= flipped[name] < end, (problem, flipped[name])
        assert problem["message"] in str(err) and name in problem["message"], problem
    assert err.problems[0]["chunk"] != err.problems[1]["chunk"]
    assert (err.file, err.storage, err.chunk, err.file_bytes) == tuple(
        err.problems[0][f] for f in ("file", "storage", "chunk", "file_bytes"))
    # zckpt.verify lists the same problems, byte ranges as (begin, end) alike
    with pytest.raises(zckpt.CorruptError) as v:
        zckpt.verify(path)
    assert v.value.problems == err.problems
