"""zckpt.transformers.use_zckpt under the Hugging Face Trainer itself (tools/ci/frameworks.sh runs
this in a virtualenv with transformers and accelerate from PyPI, on the CPU). Each run is
transformers_worker.py in a process of its own (torchrun for two ranks): train a tiny GPT-2 with a
Trainer subclass, stop after checkpoint-STOP_AT, resume it in a new process with
train(resume_from_checkpoint=...); the continuation must be bit-identical to one uninterrupted run."""
import glob
import os

import pytest

from frameworks_testing import Worker, assert_containers, assert_stopped_by_corruption, flip_storage_byte, memoized

transformers = pytest.importorskip("transformers")

MAX_STEPS = 12  # transformers_worker.MAX_STEPS
STOP_AT = 8  # a checkpoint two steps into the second epoch (6 steps an epoch on one rank)
# What the Trainer writes with torch.save into a checkpoint-N folder, besides the RNG states; the
# rest (model.safetensors, config.json, generation_config.json, trainer_state.json) stays as
# transformers writes it, and so does training_args.bin (TrainingArguments, off zckpt's allowlist).
TORCH_SAVED = ("optimizer.pt", "scheduler.pt")


WORKER = Worker("transformers_worker.py")
run, train = WORKER.run, WORKER.ok


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """ranks -> the uninterrupted run (the Trainer's default I/O; made on first use)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    return memoized(lambda ranks: train(tmp, f"full{ranks}", ranks, io="default", output_dir=str(tmp / f"out{ranks}")))


def checkpoint_files(folder, ranks=1):
    """The files of a checkpoint-N folder the Trainer wrote with torch.save."""
    rng = ["rng_state.pth"] if ranks == 1 else [f"rng_state_{r}.pth" for r in range(ranks)]
    return [os.path.join(folder, n) for n in TORCH_SAVED + tuple(rng)]


def interrupt_and_resume(tmp_path, first_io, resume_io, ranks=1, **config):
    """A run stopped after checkpoint-STOP_AT and its resume in a new process (`config`: the
    worker's other settings, its trainer)."""
    out = str(tmp_path / "out")
    first = train(tmp_path, "first", ranks, io=first_io, output_dir=out, stop_at=STOP_AT, **config)
    folder = os.path.join(out, f"checkpoint-{STOP_AT}")
    resumed = train(tmp_path, "resumed", ranks, io=resume_io, output_dir=out, resume=folder, **config)
    return first, resumed, folder


def assert_bit_identical(full, first, resumed, steps_before):
    assert first["losses"] == full["losses"][:steps_before]
    assert resumed["losses"] == full["losses"][steps_before:], "the continuation's losses differ"
    assert resumed["params"] == full["params"], "the continuation's parameters differ"
    assert resumed["global_step"] == MAX_STEPS


def assert_no_incomplete_marks(out):
    marks = glob.glob(os.path.join(out, "checkpoint-*", "zckpt-incomplete*"))
    assert not marks, f"marks left after every write landed: {marks}"


@pytest.mark.parametrize("io", ["zckpt", "zckpt-async"])
def test_checkpoint_files_are_containers_and_resume_is_bit_identical(tmp_path, uninterrupted, io):
    first, resumed, folder = interrupt_and_resume(tmp_path, io, io)
    assert_no_incomplete_marks(str(tmp_path / "out"))
    assert_bit_identical(uninterrupted(), first, resumed, STOP_AT)
    assert_containers(checkpoint_files(folder))
    with open(os.path.join(folder, "training_args.bin"), "rb") as f:
        assert f.read(2) == b"PK", "training_args.bin is torch.save's, as zckpt.save refuses TrainingArguments"
    final = os.path.join(str(tmp_path / "out"), f"checkpoint-{MAX_STEPS}")
    assert_containers(checkpoint_files(final))
    # from_pretrained reads the checkpoint folder's weights as it always does.
    model = transformers.GPT2LMHeadModel.from_pretrained(final)
    params = {n: [float(x).hex() for x in p.detach().flatten().tolist()] for n, p in model.state_dict().items()}
    assert params == resumed["params"]


def test_checkpoint_of_the_trainers_default_io_resumes(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "default", "zckpt")
    for path in checkpoint_files(folder):
        with open(path, "rb") as f:
            assert f.read(2) == b"PK", f"{path}: the Trainer's default I/O writes torch.save's zip"
    assert_bit_identical(uninterrupted(), first, resumed, STOP_AT)


@pytest.mark.parametrize("damaged", ["optimizer.pt", "rng_state.pth"])
def test_flipped_byte_stops_the_resume(tmp_path, damaged):
    out = str(tmp_path / "out")
    train(tmp_path, "first", io="zckpt", output_dir=out, stop_at=STOP_AT)
    folder = os.path.join(out, f"checkpoint-{STOP_AT}")
    path = os.path.join(folder, damaged)
    flip_storage_byte(path)
    assert_stopped_by_corruption(lambda: run(tmp_path, "resumed", io="zckpt", output_dir=out, resume=folder), path, out)


@pytest.mark.parametrize("io", ["zckpt", "zckpt-async"])
def test_torchrun_two_ranks(tmp_path, uninterrupted, io):
    # Two ranks split the examples: 3 steps an epoch, the checkpoint two steps into the third.
    first, resumed, folder = interrupt_and_resume(tmp_path, io, io, ranks=2)
    assert_bit_identical(uninterrupted(2), first, resumed, STOP_AT)
    assert_containers(checkpoint_files(folder, ranks=2))
    assert_no_incomplete_marks(str(tmp_path / "out"))


def test_async_save_total_limit_keeps_the_newest_checkpoints_whole(tmp_path, uninterrupted):
    # save_total_limit=2 over checkpoints 4, 8 and 12: the deletions wait for the background
    # writes, and end as the Trainer's own: the two newest remain, each whole.
    out = str(tmp_path / "out")
    full = train(tmp_path, "limited", io="zckpt-async", output_dir=out, save_total_limit=2)
    assert full["losses"] == uninterrupted()["losses"] and full["params"] == uninterrupted()["params"]
    assert sorted(os.listdir(out)) == ["checkpoint-12", "checkpoint-8"]
    for step in (8, 12):
        assert_containers(checkpoint_files(os.path.join(out, f"checkpoint-{step}")))
    assert_no_incomplete_marks(out)


def test_process_dying_mid_write_leaves_no_checkpoint_to_resume_silently(tmp_path, uninterrupted):
    # The process dies while checkpoint-8's optimizer.pt is being written, after the Trainer wrote
    # its trainer_state.json: without the mark, the Trainer would resume from it without the
    # optimizer's state, silently. With save_total_limit=1, checkpoint-4 survives only because the
    # deletion waited for the write.
    out = str(tmp_path / "out")
    rc, _, output = run(tmp_path, "killed", io="zckpt-async", output_dir=out, save_total_limit=1, die_writing=8)
    assert rc == 9, output[-4000:]
    dying = os.path.join(out, "checkpoint-8")
    assert os.path.exists(os.path.join(dying, "trainer_state.json")) and not os.path.exists(
        os.path.join(dying, "optimizer.pt")), output[-4000:]
    assert glob.glob(os.path.join(dying, "zckpt-incomplete.rank0"))
    assert_containers(checkpoint_files(os.path.join(out, "checkpoint-4")))

    # Named explicitly, it is refused before a step runs, naming the folder.
    rc, result, output = run(tmp_path, "refused", io="zckpt", output_dir=out, resume=dying)
    assert rc == 3 and result is not None, output[-4000:]
    assert result["error"] == "IncompleteCheckpointError" and result["file"] == dying, result
    assert result["losses"] == []
    # resume_from_checkpoint=True passes over it to checkpoint-4, and continues bit for bit.
    resumed = train(tmp_path, "latest", io="zckpt", output_dir=out, resume=True)
    assert resumed["losses"] == uninterrupted()["losses"][4:]
    assert resumed["params"] == uninterrupted()["params"]
    # The resumed run wrote checkpoint-8 again, whole: the dead process's mark went with it.
    assert_no_incomplete_marks(out)
    assert_containers(checkpoint_files(dying))
