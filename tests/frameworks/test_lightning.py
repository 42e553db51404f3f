"""zckpt.lightning.ZckptCheckpointIO under Lightning itself (tools/ci/frameworks.sh runs this in a
virtualenv with Lightning from PyPI, on the CPU). Each run is lightning_worker.py in a process of its
own: train, save through ModelCheckpoint (top-k 2 and a last.ckpt link), then resume in a new
process with fit(ckpt_path="last"); the continuation must be bit-identical to one uninterrupted run.
At two gloo ranks, FSDPStrategy's and ModelParallelStrategy's sharded checkpoints (folders that
bypass the CheckpointIO) must be zckpt DCP folders, resumed in place the same way, written with
async_save False and True (then in the background: every save and teardown must wait for the
write in flight, removals be held until it has ended, and a failed write must stop the run)."""
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


def train_first(tmp_path, io, key=1, package="lightning.pytorch", **config):
    """Trains SAVED_EPOCHS with `io`, checkpoints in tmp_path/ckpt; returns (the run, ckpt_dir)."""
    ckpt_dir = str(tmp_path / "ckpt")
    first = fit(tmp_path, "first", io=io, epochs=SAVED_EPOCHS, ckpt_dir=ckpt_dir, package=package, **run_of(key),
                **config)
    assert os.path.islink(os.path.join(ckpt_dir, "last.ckpt")), os.listdir(ckpt_dir)
    return first, ckpt_dir


def resume(tmp_path, io, ckpt_dir, key=1, package="lightning.pytorch", **config):
    """Resumes from ckpt_dir's last.ckpt in a new process with `io`, up to EPOCHS."""
    return fit(tmp_path, "resumed", io=io, epochs=EPOCHS, ckpt_dir=ckpt_dir, resume="last", package=package,
               **run_of(key), **config)


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


# Seconds each rank's container write waits (lightning_worker's write_delay) in the runs with
# async_save=True: far longer than the steps between two saves, so that every save's background
# write is still in flight at the next save, at ModelCheckpoint's removal and at teardown.
WRITE_DELAY_S = 1.0


def sharded_config(io):
    """The worker's extra config for a sharded run with `io`."""
    return {"write_delay": WRITE_DELAY_S} if io == "zckpt-async" else {}


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


@pytest.mark.parametrize("io", ["zckpt", "zckpt-async"])
@pytest.mark.parametrize("strategy", SHARDED)
def test_sharded_checkpoints_are_zckpt_folders_and_resume_is_bit_identical(tmp_path, uninterrupted, strategy, io):
    """The resume is in the same folder (ModelCheckpoint restores its top-k only there), so that
    its saves replace and remove the first run's."""
    first, ckpt_dir = train_first(tmp_path, io, strategy, **sharded_config(io))
    kept = saved_checkpoints(ckpt_dir)
    assert len(kept) == SAVED_EPOCHS, kept
    for folder in kept:
        assert_zckpt_folder(folder)
    resumed = resume(tmp_path, io, ckpt_dir, strategy, **sharded_config(io))
    assert_bit_identical(uninterrupted(strategy), first, resumed)
    kept = saved_checkpoints(ckpt_dir)
    assert len(kept) == 2, kept
    for folder in kept:
        assert_zckpt_folder(folder)
    # ModelCheckpoint's top-k 2 removed the others, each right after a save, and only once the
    # folder saved last was whole.
    assert sorted(resumed["removed"] + [os.path.basename(f) for f in kept]) == sorted(
        f"epoch={e}-step={(e + 1) * STEPS_PER_EPOCH}.ckpt" for e in range(EPOCHS)), resumed["removed"]
    assert resumed["removed_before_whole"] == [], resumed["removed_before_whole"]


@pytest.mark.parametrize("strategy", SHARDED)
def test_failed_background_write_stops_the_next_sharded_save(tmp_path, strategy):
    """async_save=True: rank 1's container of the second save cannot be written (a directory holds
    its name); the next save raises that write's error on every rank, naming the file, and the
    folder is left without the marks of a whole checkpoint."""
    ckpt_dir = str(tmp_path / "ckpt")
    failed = os.path.join(ckpt_dir, f"epoch=1-step={2 * STEPS_PER_EPOCH}.ckpt")
    rc, result, output = WORKER.run(tmp_path, "first", package="lightning.pytorch", io="zckpt-async", epochs=EPOCHS,
                                    ckpt_dir=ckpt_dir, blocked=os.path.join(os.path.basename(failed), "__1_0.zckpt"),
                                    **run_of(strategy))
    assert rc == 3 and result is not None, output[-4000:]
    assert result["error"] == "InvalidArgumentError", result
    assert os.path.join(failed, "__1_0.zckpt") in result["message"], result["message"]
    assert len(result["losses"]) == 3 * STEPS_PER_EPOCH, "the failure was not raised by the next save"
    assert sorted(os.listdir(failed)) == ["__0_0.zckpt", "__1_0.zckpt"], os.listdir(failed)
    assert_zckpt_folder(os.path.join(ckpt_dir, f"epoch=0-step={STEPS_PER_EPOCH}.ckpt"))


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


@pytest.mark.parametrize("log_model, save_top_k, refused", [("all", 2, True), (True, -1, True), (True, 2, False),
                                                            (False, -1, False)])
def test_background_sharded_save_is_refused_while_a_logger_uploads_each_save(log_model, save_top_k, refused):
    """Lightning's WandbLogger, MLFlowLogger and LitLogger read each checkpoint right after its save
    with log_model="all", or log_model=True and save_top_k=-1 (otherwise at the end of fit)."""
    from types import SimpleNamespace

    from zckpt.lightning import _refuse_uploads_at_save

    logger = SimpleNamespace(_log_model=log_model)
    trainer = SimpleNamespace(loggers=[SimpleNamespace(), logger],
                              checkpoint_callbacks=[SimpleNamespace(save_top_k=save_top_k)])
    strategy = SimpleNamespace(lightning_module=SimpleNamespace(_trainer=trainer))
    if refused:
        with pytest.raises(RuntimeError, match=f"log_model={log_model!r}.*folder still being written"):
            _refuse_uploads_at_save(strategy)
    else:
        _refuse_uploads_at_save(strategy)


@pytest.mark.parametrize("strategy", SHARDED)
def test_flipped_byte_in_one_ranks_container_stops_the_sharded_resume(tmp_path, sharded_saves, strategy):
    ckpt_dir = copy_of(sharded_saves(strategy)[1], tmp_path)
    damaged = os.path.join(os.path.realpath(os.path.join(ckpt_dir, "last.ckpt")), f"__{DAMAGED_RANK}_0.zckpt")
    flip_storage_byte(damaged)
    assert_stopped_by_corruption(lambda: WORKER.run(tmp_path, "resumed", package="lightning.pytorch", io="zckpt",
                                                    epochs=EPOCHS, ckpt_dir=ckpt_dir, resume="last",
                                                    **run_of(strategy)), damaged, ckpt_dir)
