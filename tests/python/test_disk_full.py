"""Disk full during save, DCP write, merge and reshard (issue 22, part 5).

Each writer is pointed at a small tmpfs (mounted here; skipped where mounting is not allowed)
that already holds an older result. What must hold: a ZckptError (or the CLI's exit 2) whose
message names the path and says the disk is full, the old destination byte for byte intact, and
nothing else left in the folder (no temporary, no work folder).
"""
import errno
import os
import subprocess
import sys

import pytest
import torch

import zckpt
from zckpt_testing import run_cli

NO_SPACE = os.strerror(errno.ENOSPC)


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _big(mb=4, step=2):
    return {"step": step, "w": torch.arange(mb * 2**20 // 4, dtype=torch.float32)}


def _small(step=1):
    return {"step": step, "w": torch.full((1024,), float(step))}


def _snapshot(folder):
    """{relative path: bytes} of every file below `folder`."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            out[os.path.relpath(p, folder)] = open(p, "rb").read()
    return out


def test_save_onto_a_full_disk(small_fs):
    dest = small_fs / "model.zckpt"
    zckpt.save(_small(), dest)
    before = _snapshot(small_fs)
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.save(_big(), dest)
    assert str(dest) in str(e.value) and NO_SPACE in str(e.value), str(e.value)
    assert _snapshot(small_fs) == before
    assert zckpt.load(dest)["step"] == 1
    # The background save: the same error on its Future.
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.async_save(_big(), dest).result()
    assert str(dest) in str(e.value) and NO_SPACE in str(e.value), str(e.value)
    assert _snapshot(small_fs) == before


def _dcp_save(state, folder):
    import torch.distributed.checkpoint as dcp

    from zckpt.dcp import ZckptStorageWriter

    dcp.save(state, storage_writer=ZckptStorageWriter(str(folder)))


def test_dcp_write_onto_a_full_disk(small_fs):
    folder = small_fs / "step"
    _dcp_save({"model": _small()}, folder)
    before = _snapshot(small_fs)
    with pytest.raises(BaseException) as e:  # DCP wraps the writer's error in its CheckpointException (a BaseException)
        _dcp_save({"model": _big()}, folder)
    assert NO_SPACE in str(e.value) and str(folder) in str(e.value), str(e.value)
    assert _snapshot(small_fs) == before


def test_merge_onto_a_full_disk(tmp_path, small_fs):
    src = tmp_path / "dcp"
    _dcp_save({"model": _big()}, src)
    dest = small_fs / "model.zckpt"
    zckpt.save(_small(), dest)
    before = _snapshot(small_fs)
    r = run_cli("merge", src, "-o", dest, "--force")
    assert r.returncode == 2, r.stdout + r.stderr
    assert str(dest) in r.stderr and NO_SPACE in r.stderr, r.stderr
    assert _snapshot(small_fs) == before


def test_reshard_onto_a_full_disk(tmp_path, small_fs):
    # verl per-rank files without sharded tensors (extra_state: per-rank state; a model family of
    # plain tensors is refused as an unreshardable world-size-1 FSDP1 save): reshard re-saves rank
    # r % 2 as each new rank, after reading rank 0's file as the template (converted inside its
    # work folder, in `out`).
    ck = tmp_path / "ck"
    ck.mkdir()
    for r in range(2):
        torch.save(_big(mb=2, step=r), ck / f"extra_state_world_size_2_rank_{r}.pt")
    out = small_fs / "out"
    out.mkdir()
    (out / "extra_state_world_size_4_rank_0.pt").write_bytes(b"old")
    before = _snapshot(small_fs)
    r = subprocess.run([sys.executable, "-m", "zckpt", "reshard", str(ck), "--world-size", "4", "-o", str(out),
                        "--format", "pt", "--force"], capture_output=True, text=True)
    assert r.returncode != 0, r.stdout + r.stderr
    assert str(out) in r.stderr and NO_SPACE in r.stderr, r.stderr
    assert _snapshot(small_fs) == before, "a full disk left files behind or changed the old ones"
