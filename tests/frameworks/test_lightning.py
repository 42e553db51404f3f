"""zckpt.lightning.ZckptCheckpointIO under Lightning itself (tools/ci/frameworks.sh runs this in a
virtualenv with Lightning from PyPI, on the CPU). Each run is lightning_worker.py in a process of its
own: train, save through ModelCheckpoint (top-k 2 and a last.ckpt link), then resume in a new
process with fit(ckpt_path="last"); the continuation must be bit-identical to one uninterrupted run."""
import os

import pytest

from frameworks_testing import Worker, assert_containers, assert_stopped_by_corruption, flip_storage_byte, memoized

pytest.importorskip("lightning")

EPOCHS = 4  # the uninterrupted run's; the interrupted one stops after SAVED_EPOCHS
SAVED_EPOCHS = 2
STEPS_PER_EPOCH = 4  # lightning_worker.STEPS_PER_EPOCH


WORKER = Worker("lightning_worker.py")


def fit(tmp_path, name, **config):
    return WORKER.ok(tmp_path, name, **dict({"package": "lightning.pytorch"}, **config))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """devices -> the uninterrupted run (Lightning's default I/O; made on first use)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    return memoized(lambda devices: fit(tmp, f"full{devices}", io="default", epochs=EPOCHS, devices=devices,
                                        ckpt_dir=str(tmp / f"ckpt{devices}")))


def saved_checkpoints(ckpt_dir):
    """The epoch checkpoints ModelCheckpoint kept (last.ckpt, a link to one of them, apart)."""
    return sorted(os.path.join(ckpt_dir, n) for n in os.listdir(ckpt_dir) if n.startswith("epoch="))


def interrupt_and_resume(tmp_path, first_io, resume_io, devices=1, package="lightning.pytorch"):
    """Trains SAVED_EPOCHS with `first_io`, resumes from last.ckpt in a new process with
    `resume_io` up to EPOCHS; returns (first run, resumed run, ckpt_dir)."""
    ckpt_dir = str(tmp_path / "ckpt")
    first = fit(tmp_path, "first", io=first_io, epochs=SAVED_EPOCHS, devices=devices, ckpt_dir=ckpt_dir,
                package=package)
    last = os.path.join(ckpt_dir, "last.ckpt")
    assert os.path.islink(last), os.listdir(ckpt_dir)
    resumed = fit(tmp_path, "resumed", io=resume_io, epochs=EPOCHS, devices=devices, ckpt_dir=ckpt_dir,
                  resume="last", package=package)
    return first, resumed, ckpt_dir


def assert_bit_identical(full, first, resumed):
    split = SAVED_EPOCHS * STEPS_PER_EPOCH
    assert first["losses"] == full["losses"][:split]
    assert resumed["losses"] == full["losses"][split:], "the continuation's losses differ from the uninterrupted run's"
    assert resumed["params"] == full["params"], "the continuation's parameters differ from the uninterrupted run's"
    assert resumed["global_step"] == EPOCHS * STEPS_PER_EPOCH


@pytest.mark.parametrize("io", ["zckpt", "zckpt-async"])
def test_checkpoints_are_containers_and_resume_is_bit_identical(tmp_path, uninterrupted, io):
    first, resumed, ckpt_dir = interrupt_and_resume(tmp_path, io, io)
    assert_bit_identical(uninterrupted(), first, resumed)
    # Top-k 2 of 4 epochs: ModelCheckpoint removed the others through remove_checkpoint.
    kept = saved_checkpoints(ckpt_dir)
    assert len(kept) == 2, kept
    assert_containers(kept + [os.path.realpath(os.path.join(ckpt_dir, "last.ckpt"))])


def test_pytorch_lightning_package(tmp_path, uninterrupted):
    first, resumed, ckpt_dir = interrupt_and_resume(tmp_path, "zckpt", "zckpt", package="pytorch_lightning")
    assert_bit_identical(uninterrupted(), first, resumed)
    assert_containers(saved_checkpoints(ckpt_dir))


def test_checkpoint_of_lightnings_default_io_resumes(tmp_path, uninterrupted):
    ckpt_dir = str(tmp_path / "ckpt")
    first = fit(tmp_path, "first", io="default", epochs=SAVED_EPOCHS, ckpt_dir=ckpt_dir)
    for path in saved_checkpoints(ckpt_dir):
        with open(path, "rb") as f:
            assert f.read(2) == b"PK", f"{path}: Lightning's default I/O writes torch.save's zip"
    resumed = fit(tmp_path, "resumed", io="zckpt", epochs=EPOCHS, ckpt_dir=ckpt_dir, resume="last")
    assert_bit_identical(uninterrupted(), first, resumed)


def test_flipped_byte_stops_the_resume(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    fit(tmp_path, "first", io="zckpt", epochs=SAVED_EPOCHS, ckpt_dir=ckpt_dir)
    damaged = os.path.realpath(os.path.join(ckpt_dir, "last.ckpt"))
    flip_storage_byte(damaged)
    assert_stopped_by_corruption(lambda: WORKER.run(tmp_path, "resumed", package="lightning.pytorch", io="zckpt",
                                                    epochs=EPOCHS, ckpt_dir=ckpt_dir, resume="last"), damaged, ckpt_dir)


def test_ddp_two_ranks(tmp_path, uninterrupted):
    first, resumed, ckpt_dir = interrupt_and_resume(tmp_path, "zckpt", "zckpt", devices=2)
    assert_bit_identical(uninterrupted(2), first, resumed)
    assert_containers(saved_checkpoints(ckpt_dir))
