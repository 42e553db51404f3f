"""zckpt.lightning.ZckptCheckpointIO under Lightning itself (tools/ci/frameworks.sh runs this in a
virtualenv with Lightning from PyPI, on the CPU). Each run is lightning_worker.py in a process of its
own: train, save through ModelCheckpoint (top-k 2 and a last.ckpt link), then resume in a new
process with fit(ckpt_path="last"); the continuation must be bit-identical to one uninterrupted run.
At two gloo ranks, FSDPStrategy's and ModelParallelStrategy's sharded checkpoints (folders that
bypass the CheckpointIO) must be zckpt DCP folders, resumed in place the same way."""
import os
import shutil

import pytest

from frameworks_testing import Worker, assert_containers, assert_stopped_by_corruption, flip_storage_byte, memoized
from zckpt_testing import run_cli

pytest.importorskip("lightning")

EPOCHS = 4  # the uninterrupted run's; the interrupted one stops after SAVED_EPOCHS
SAVED_EPOCHS = 2
STEPS_PER_EPOCH = 4  # lightning_worker.STEPS_PER_EPOCH


WORKER = Worker("lightning_worker.py")


def fit(tmp_path, name, **config):
    return WORKER.ok(tmp_path, name, **dict({"package": "lightning.pytorch"}, **config))


# The strategies whose sharded checkpoints are folders (two gloo ranks): FSDPStrategy's
# state_dict_type="sharded" and ModelParallelStrategy's save_distributed_checkpoint=True.
SHARDED = ["fsdp", "model_parallel"]
RANKS = 2
# The files of a sharded checkpoint written with zckpt: DCP's .metadata, a container per rank,
# and Lightning's meta.pt (the rest of the checkpoint) a container too.
ZCKPT_FOLDER = [".metadata"] + [f"__{r}_0.zckpt" for r in range(RANKS)] + ["meta.pt"]
DAMAGED_RANK = 1


def run_of(key):
    """fit's devices and strategy for a run key: a device count (1, or 2 for DDP) or a sharded
    strategy's name (two ranks)."""
    return {"devices": key} if isinstance(key, int) else {"devices": RANKS, "strategy": key}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """run key (run_of) -> the uninterrupted run (Lightning's default I/O; made on first use)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    return memoized(lambda key: fit(tmp, f"full{key}", io="default", epochs=EPOCHS, ckpt_dir=str(tmp / f"ckpt{key}"),
                                    **run_of(key)))


def saved_checkpoints(ckpt_dir):
    """The epoch checkpoints ModelCheckpoint kept (last.ckpt, a link to one of them, apart)."""
    return sorted(os.path.join(ckpt_dir, n) for n in os.listdir(ckpt_dir) if n.startswith("epoch="))


def train_first(tmp_path, io, key=1, package="lightning.pytorch"):
    """Trains SAVED_EPOCHS with `io`, checkpoints in tmp_path/ckpt; returns (the run, ckpt_dir)."""
    ckpt_dir = str(tmp_path / "ckpt")
    first = fit(tmp_path, "first", io=io, epochs=SAVED_EPOCHS, ckpt_dir=ckpt_dir, package=package, **run_of(key))
    assert os.path.islink(os.path.join(ckpt_dir, "last.ckpt")), os.listdir(ckpt_dir)
    return first, ckpt_dir


def resume(tmp_path, io, ckpt_dir, key=1, package="lightning.pytorch"):
    """Resumes from ckpt_dir's last.ckpt in a new process with `io`, up to EPOCHS."""
    return fit(tmp_path, "resumed", io=io, epochs=EPOCHS, ckpt_dir=ckpt_dir, resume="last", package=package,
               **run_of(key))


def interrupt_and_resume(tmp_path, first_io, resume_io, key=1, package="lightning.pytorch"):
    """Trains SAVED_EPOCHS with `first_io`, resumes from last.ckpt in a new process with
    `resume_io` up to EPOCHS; returns (first run, resumed run, ckpt_dir)."""
    first, ckpt_dir = train_first(tmp_path, first_io, key, package)
    return first, resume(tmp_path, resume_io, ckpt_dir, key, package), ckpt_dir


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
    first, resumed, ckpt_dir = interrupt_and_resume(tmp_path, "zckpt", "zckpt", key=2)
    assert_bit_identical(uninterrupted(2), first, resumed)
    assert_containers(saved_checkpoints(ckpt_dir))


@pytest.fixture(scope="module")
def sharded_saves(tmp_path_factory):
    """strategy -> (the first run with zckpt, its ckpt_dir), made once: each test resumes from a
    copy of the folder."""
    return memoized(lambda strategy: train_first(tmp_path_factory.mktemp(strategy), "zckpt", strategy))


def copy_of(ckpt_dir, tmp_path):
    """ckpt_dir copied under tmp_path (last.ckpt stays a link to its epoch folder)."""
    copy = str(tmp_path / "ckpt")
    shutil.copytree(ckpt_dir, copy, symlinks=True)
    return copy


def assert_zckpt_folder(folder):
    """A sharded checkpoint written with zckpt: no .distcp, every file a container `zckpt verify`
    passes, and the folder verified as one DCP checkpoint."""
    assert sorted(os.listdir(folder)) == ZCKPT_FOLDER, os.listdir(folder)
    assert_containers([os.path.join(folder, n) for n in ZCKPT_FOLDER[1:]])
    r = run_cli("verify", folder)
    assert r.returncode == 0 and f"{RANKS} containers verified" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("strategy", SHARDED)
def test_sharded_checkpoints_are_zckpt_folders_and_resume_is_bit_identical(tmp_path, uninterrupted, sharded_saves,
                                                                           strategy):
    first, saved_dir = sharded_saves(strategy)
    kept = saved_checkpoints(saved_dir)
    assert len(kept) == SAVED_EPOCHS, kept
    for folder in kept:
        assert_zckpt_folder(folder)
    ckpt_dir = copy_of(saved_dir, tmp_path)
    assert_bit_identical(uninterrupted(strategy), first, resume(tmp_path, "zckpt", ckpt_dir, strategy))
    for folder in saved_checkpoints(ckpt_dir):  # those the resumed run wrote too (top-k 2)
        assert_zckpt_folder(folder)


@pytest.mark.parametrize("strategy", SHARDED)
def test_sharded_checkpoint_of_lightnings_default_io_resumes(tmp_path, uninterrupted, strategy):
    first, ckpt_dir = train_first(tmp_path, "default", strategy)
    last = os.path.realpath(os.path.join(ckpt_dir, "last.ckpt"))
    assert sorted(os.listdir(last)) == [".metadata"] + [f"__{r}_0.distcp" for r in range(RANKS)] + ["meta.pt"]
    resumed = resume(tmp_path, "zckpt", ckpt_dir, strategy)
    assert_bit_identical(uninterrupted(strategy), first, resumed)


def test_full_checkpoint_of_model_parallel_is_a_container_and_resumes_bit_identical(tmp_path, uninterrupted):
    """ModelParallelStrategy(save_distributed_checkpoint=False): its one-file checkpoint goes
    through the CheckpointIO (a container), and its load reads the file itself with
    torch.load(mmap=True), routed to zckpt.load."""
    strategy = "model_parallel_full"
    first, ckpt_dir = train_first(tmp_path, "zckpt", strategy)
    assert len(saved_checkpoints(ckpt_dir)) == SAVED_EPOCHS
    assert_containers(saved_checkpoints(ckpt_dir))
    assert_bit_identical(uninterrupted(strategy), first, resume(tmp_path, "zckpt", ckpt_dir, strategy))


@pytest.mark.parametrize("strategy", SHARDED)
def test_flipped_byte_in_one_ranks_container_stops_the_sharded_resume(tmp_path, sharded_saves, strategy):
    ckpt_dir = copy_of(sharded_saves(strategy)[1], tmp_path)
    damaged = os.path.join(os.path.realpath(os.path.join(ckpt_dir, "last.ckpt")), f"__{DAMAGED_RANK}_0.zckpt")
    flip_storage_byte(damaged)
    assert_stopped_by_corruption(lambda: WORKER.run(tmp_path, "resumed", package="lightning.pytorch", io="zckpt",
                                                    epochs=EPOCHS, ckpt_dir=ckpt_dir, resume="last",
                                                    **run_of(strategy)), damaged, ckpt_dir)
