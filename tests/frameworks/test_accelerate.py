"""zckpt.accelerate.use_zckpt under accelerate itself (tools/ci/frameworks.sh runs this in a
virtualenv with accelerate from PyPI, on the CPU). Each run is accelerate_worker.py in a process of
its own (torchrun for two ranks): a training loop that calls save_state after SAVE_AT steps and
stops, then a new process that calls load_state and goes on; the continuation must be
bit-identical to one uninterrupted run."""
import os

import pytest

from frameworks_testing import Worker, assert_containers, assert_stopped_by_corruption, flip_storage_byte, memoized

pytest.importorskip("accelerate")

SAVE_AT = 6  # accelerate_worker.SAVE_AT


WORKER = Worker("accelerate_worker.py")
run, train = WORKER.run, WORKER.ok


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """ranks -> the uninterrupted run (made on first use)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    return memoized(lambda ranks: train(tmp, f"full{ranks}", ranks, io="default"))


def state_files(folder, ranks=1):
    """What save_state writes, all with torch.save under use_zckpt: the model (pytorch_model.bin),
    optimizer, scheduler, one RNG file per rank and the registered Progress object."""
    names = ["pytorch_model.bin", "optimizer.bin", "scheduler.bin", "custom_checkpoint_0.pkl"]
    names += [f"random_states_{r}.pkl" for r in range(ranks)]
    return [os.path.join(folder, n) for n in names]


def interrupt_and_resume(tmp_path, first_io, resume_io, ranks=1):
    folder = str(tmp_path / "state")
    first = train(tmp_path, "first", ranks, io=first_io, save_dir=folder)
    resumed = train(tmp_path, "resumed", ranks, io=resume_io, resume=folder)
    return first, resumed, folder


def assert_bit_identical(full, first, resumed):
    assert first["losses"] == full["losses"][:SAVE_AT]
    assert resumed["losses"] == full["losses"][SAVE_AT:], "the continuation's losses differ"
    assert resumed["params"] == full["params"], "the continuation's parameters differ"
    assert resumed["global_step"] == full["global_step"]


def test_state_files_are_containers_and_resume_is_bit_identical(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "zckpt", "zckpt")
    assert_bit_identical(uninterrupted(), first, resumed)
    written = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    assert written == sorted(state_files(folder))
    assert_containers(written)


def test_state_of_accelerates_default_io_loads(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "default", "zckpt")
    assert os.path.exists(os.path.join(folder, "model.safetensors")), os.listdir(folder)
    with open(os.path.join(folder, "optimizer.bin"), "rb") as f:
        assert f.read(2) == b"PK", "accelerate's default I/O writes torch.save's zip"
    assert_bit_identical(uninterrupted(), first, resumed)


@pytest.mark.parametrize("damaged", ["pytorch_model.bin", "optimizer.bin"])
def test_flipped_byte_stops_the_load(tmp_path, damaged):
    folder = str(tmp_path / "state")
    train(tmp_path, "first", io="zckpt", save_dir=folder)
    path = os.path.join(folder, damaged)
    flip_storage_byte(path)
    assert_stopped_by_corruption(lambda: run(tmp_path, "resumed", io="zckpt", resume=folder), path, folder)


def test_torchrun_two_ranks(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "zckpt", "zckpt", ranks=2)
    assert_bit_identical(uninterrupted(2), first, resumed)
    assert_containers(state_files(folder, ranks=2))
