"""`zckpt.torchtitan.use_zckpt()` with torchtitan 0.3.0 itself (its CheckpointManager, unedited),
at two gloo ranks on the CPU with FSDP2 (torchtitan_worker.py; its trainer needs CUDA, so the
worker builds what CheckpointManager takes and drives its save and load directly): the save
writes a zckpt DCP folder (containers, no .distcp) that `zckpt verify` passes; a resume in new
processes through CheckpointManager.load continues bit for bit like the uninterrupted run, from
the zckpt save and from a save made with torchtitan's default I/O; a flipped byte fails the load
on every rank with zckpt.CorruptError naming the file and the chunk.

Run by tools/ci/frameworks.sh with a Python that has torchtitan (its cached virtualenv)."""
import os
import shutil
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gloo_ranks  # noqa: E402
import torchtitan_worker  # noqa: E402

# Two ranks, so that each container holds one rank's FSDP2 shards and DCP plans across ranks.
WS = 2
BAD_RANK = 1


def _spawn(phase, root):
    return gloo_ranks.spawn(os.path.join(HERE, "torchtitan_worker.py"), WS, phase, root)


def _step_folder(root, folder):
    return os.path.join(root, folder, f"step-{torchtitan_worker.STEPS_BEFORE}")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("torchtitan"))
    for r, res in _spawn("save", root).items():
        bad = {k: v for k, v in res.items() if v is not None}
        assert not bad, (r, bad)
    return root


def test_torchtitan_save_writes_a_zckpt_dcp_folder_that_verifies(saved):
    folder = _step_folder(saved, "zckpt")
    assert sorted(os.listdir(folder)) == [".metadata"] + [f"__{r}_0.zckpt" for r in range(WS)]
    r = gloo_ranks.cli("verify", folder)
    assert r.returncode == 0 and "2 containers verified" in r.stdout, r.stdout + r.stderr
    # torchtitan's default I/O, saved before use_zckpt(), wrote DCP's own shards.
    default = sorted(os.listdir(_step_folder(saved, "default")))
    assert default == [".metadata"] + [f"__{r}_0.distcp" for r in range(WS)], default


def test_torchtitan_resume_continues_bit_for_bit_from_zckpt_and_default_saves(saved):
    for r, res in _spawn("resume", saved).items():
        assert len(res) == 5 * len(torchtitan_worker.FOLDERS), sorted(res)
        bad = {k: v for k, v in res.items() if v is not None}
        assert not bad, (r, bad)


def test_torchtitan_load_of_a_flipped_byte_raises_corrupt_error_on_every_rank(saved):
    bad = _step_folder(saved, "bad")
    shutil.rmtree(os.path.dirname(bad), ignore_errors=True)
    shutil.copytree(_step_folder(saved, "zckpt"), bad)
    victim = os.path.join(bad, f"__{BAD_RANK}_0.zckpt")
    gloo_ranks.flip_chunk_byte(victim)
    for r, res in _spawn("corrupt", saved).items():
        got = res["raised"]
        assert got is not None, f"rank {r}: the load went on"
        assert got["class"] == "CorruptError", (r, got)
        assert got["file"] == victim and got["chunk"] is not None, (r, got)
        assert os.path.basename(victim) in got["message"] and "chunk" in got["message"], (r, got)
        assert res["no step ran"] is None, (r, res)
