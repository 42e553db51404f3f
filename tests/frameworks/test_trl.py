"""zckpt.transformers.use_zckpt under TRL's SFTTrainer, a Trainer subclass nobody here wrote
(tools/ci/frameworks.sh runs this in a virtualenv with trl, transformers and accelerate from PyPI,
on the CPU). transformers_worker.py with trainer "sft": SFTTrainer tokenizes text rows with a word
tokenizer made in the worker and trains the tiny GPT-2 of test_transformers.py; a run stopped after
checkpoint-STOP_AT resumes in a new process through train(resume_from_checkpoint=...), and the
continuation must be bit-identical to one uninterrupted run, on one process and on two ranks
(torchrun), with async_save too."""
import os

import pytest

from frameworks_testing import assert_containers, assert_stopped_by_corruption, flip_storage_byte, memoized
from test_transformers import STOP_AT, WORKER, assert_bit_identical, checkpoint_files, interrupt_and_resume

pytest.importorskip("trl")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """ranks -> SFTTrainer's uninterrupted run with its default I/O (made on first use)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    return memoized(lambda ranks: WORKER.ok(tmp, f"full{ranks}", ranks, io="default", trainer="sft",
                                            output_dir=str(tmp / f"out{ranks}")))


def test_sft_checkpoints_are_containers_and_resume_is_bit_identical(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "zckpt", "zckpt", trainer="sft")
    assert_bit_identical(uninterrupted(), first, resumed, STOP_AT)
    assert_containers(checkpoint_files(folder))


def test_sft_checkpoint_of_the_default_io_resumes(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "default", "zckpt", trainer="sft")
    with open(os.path.join(folder, "optimizer.pt"), "rb") as f:
        assert f.read(2) == b"PK", "the default I/O writes torch.save's zip"
    assert_bit_identical(uninterrupted(), first, resumed, STOP_AT)


def test_sft_flipped_byte_stops_the_resume(tmp_path):
    out = str(tmp_path / "out")
    WORKER.ok(tmp_path, "first", io="zckpt", trainer="sft", output_dir=out, stop_at=STOP_AT)
    folder = os.path.join(out, f"checkpoint-{STOP_AT}")
    path = os.path.join(folder, "optimizer.pt")
    flip_storage_byte(path)
    assert_stopped_by_corruption(
        lambda: WORKER.run(tmp_path, "resumed", io="zckpt", trainer="sft", output_dir=out, resume=folder), path, out)


@pytest.mark.parametrize("io", ["zckpt", "zckpt-async"])
def test_sft_torchrun_two_ranks(tmp_path, uninterrupted, io):
    first, resumed, folder = interrupt_and_resume(tmp_path, io, io, ranks=2, trainer="sft")
    assert_bit_identical(uninterrupted(2), first, resumed, STOP_AT)
    assert_containers(checkpoint_files(folder, ranks=2))
