"""zckpt/_folder_writes.py: a checkpoint folder written in the background carries its
`zckpt-incomplete.rank0` mark from the first file handed over until it is sealed and every write
has landed; a write that fails, or a folder never sealed, keeps it, and wait() raises the error."""
import dataclasses
import os

import pytest
import torch

import zckpt
from zckpt._folder_writes import FolderWrites, clear_stale_mark, incomplete_marks, refuse_incomplete

MARK = "zckpt-incomplete.rank0"


@pytest.fixture
def writes():
    w = FolderWrites()
    yield w
    w.close()


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"state": {0: {"exp_avg": torch.randn(256, 256, generator=g), "step": torch.tensor(3.0)}}, "lr": 0.1}


def _assert_equal(got, want):
    assert got["lr"] == want["lr"]
    for key in ("exp_avg", "step"):
        assert torch.equal(got["state"][0][key], want["state"][0][key])


def test_mark_held_until_sealed_and_landed(tmp_path, writes):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    objs = {name: _state(i) for i, name in enumerate(["optimizer.pt", "rng_state.pth"])}
    for name, obj in objs.items():
        writes.save(obj, folder / name)
    # Not sealed: the folder is not whole yet, however far its writes have got.
    assert incomplete_marks(folder) == [MARK]
    with pytest.raises(zckpt.IncompleteCheckpointError) as e:
        refuse_incomplete(str(folder), instead="checkpoint-2")
    assert e.value.file == str(folder) and "checkpoint-2" in str(e.value)
    writes.seal_all()
    writes.wait()
    assert incomplete_marks(folder) == []
    refuse_incomplete(str(folder))  # whole: nothing raised
    for name, obj in objs.items():
        assert zckpt.verify(folder / name) is not None
        _assert_equal(zckpt.load(folder / name), obj)


def test_snapshot_is_what_is_written(tmp_path, writes):
    # The caller may change the object as soon as save() returns (the next optimizer step).
    obj = _state(0)
    want = {"state": {0: {k: v.clone() for k, v in obj["state"][0].items()}}, "lr": 0.1}
    writes.save(obj, tmp_path / "optimizer.pt")
    obj["state"][0]["exp_avg"].add_(1.0)
    writes.seal_all()
    writes.wait()
    _assert_equal(zckpt.load(tmp_path / "optimizer.pt"), want)


def test_failed_write_keeps_the_mark_and_is_raised(tmp_path, writes):
    folder = tmp_path / "checkpoint-8"
    folder.mkdir()
    (folder / "optimizer.pt").mkdir()  # the write's final rename cannot replace a folder
    writes.save(_state(0), folder / "optimizer.pt")
    writes.save(_state(1), folder / "scheduler.pt")
    writes.seal_all()
    with pytest.raises(zckpt.ZckptError) as e:
        writes.wait()
    assert "optimizer.pt" in str(e.value)
    assert incomplete_marks(folder) == [MARK]
    writes.wait()  # raised once: nothing more in flight


def test_unsealed_folder_keeps_its_mark(tmp_path, writes):
    folder = tmp_path / "checkpoint-12"
    folder.mkdir()
    writes.save(_state(0), folder / "optimizer.pt")
    writes.wait()  # the save that handed it over raised before sealing it
    assert zckpt.verify(folder / "optimizer.pt") is not None
    assert incomplete_marks(folder) == [MARK]
    # A later synchronous save of the whole folder takes the stale mark off.
    clear_stale_mark(str(folder))
    assert incomplete_marks(folder) == []


@dataclasses.dataclass
class Arguments:
    output_dir: str


def test_refused_object_is_refused_by_save_and_marks_nothing(tmp_path, writes):
    with pytest.raises(zckpt.UnsafeError):
        writes.save({"args": Arguments("out")}, tmp_path / "training_args.bin")
    assert not os.listdir(tmp_path)
