"""A killed writer leaves nothing behind (issue 22, part 2), measured as the issue measured it.

12 SIGKILLs each, at random moments of the write, of `zckpt.save`, `zckpt convert --force` and
`zckpt export --force` over an existing destination; after each kill the folder's files are
counted. What must hold: the destination is always the old file or the new one, whole; nothing
else is in the folder (an O_TMPFILE has no name while it is written; the only named instant is
between the finished file's link and its rename, so at most a rare kill there leaves a named
temporary of the dead writer), and the next writer in the folder removes whatever a kill left.
Where the filesystem has no O_TMPFILE, writers name their temporary from the start: then a kill
mid-write leaves one, and only the "next writer removes it" half is asserted.

The figures (kills, torn, left after the kill, left after the next writer) are printed: run with
`pytest -s` to see them.
"""
import os
import random
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import zckpt

KILLS = 12
MB = 32  # per checkpoint: long enough that most kills land inside the write

SAVER = textwrap.dedent("""
    import sys, time, torch, zckpt
    step, dest = int(sys.argv[1]), sys.argv[2]
    g = torch.Generator().manual_seed(step)
    state = {"step": step, "w": torch.randn(%d, generator=g)}
    print("ready", flush=True)
    t = time.monotonic()
    zckpt.save(state, dest)
    print(time.monotonic() - t, flush=True)
""" % (MB * 2**20 // 4))


def _state(step):
    g = torch.Generator().manual_seed(step)
    return {"step": step, "w": torch.randn(MB * 2**20 // 4, generator=g)}


def _has_tmpfile(folder):
    try:
        os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600))
        return True
    except (OSError, AttributeError):
        return False


def _zckpt_bin():
    return os.environ.get("ZCKPT_BIN") or "zckpt"


class Writer:
    """One kind of writer: how to start it (Popen), when its write begins, how to check a result."""

    def __init__(self, name, folder, dest, start, check):
        self.name, self.folder, self.dest, self.start, self.check = name, folder, dest, start, check

    def run_whole(self):
        """Seconds one uninterrupted write takes here (zckpt.save: from "ready", as the kills)."""
        t = time.monotonic()
        p = self.start()
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        return float(out.split()[1]) if self.name == "zckpt.save" else time.monotonic() - t


def _kill_and_count(w, seconds, rng, keep):
    figures = {"kills": 0, "torn": 0, "left_after_kill": 0}
    earlier = set()
    for _ in range(KILLS):
        p = w.start()
        if w.name == "zckpt.save":  # torch's import is no part of the write: start the clock at "ready"
            assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0, seconds))
        p.kill()
        p.communicate()
        figures["kills"] += 1
        left = set(os.listdir(w.folder)) - keep
        figures["left_after_kill"] += len(left - earlier)  # this kill's litter, not the earlier ones'
        earlier = left
        for name in left:
            assert ".zckpt-tmp-" in name, f"{w.name}: a kill left {name!r}"
        try:
            w.check(w.dest)
        except AssertionError:
            figures["torn"] += 1
    return figures


def test_writers_killed_at_random_moments_leave_nothing(tmp_path):
    rng = random.Random(22)
    bin_ = _zckpt_bin()
    src_pt, src_z = tmp_path / "src" / "step2.pt", tmp_path / "src" / "step2.zckpt"
    src_pt.parent.mkdir()
    torch.save(_state(2), src_pt)
    zckpt.save(_state(2), src_z)
    expected = {1: _state(1), 2: _state(2)}

    def check_container(path):
        got = zckpt.load(path)
        assert got["step"] in expected and torch.equal(got["w"], expected[got["step"]]["w"])

    def check_pt(path):
        got = torch.load(path, weights_only=True)
        assert got["step"] in expected and torch.equal(got["w"], expected[got["step"]]["w"])

    def quiet(cmd):
        return lambda: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    writers = []
    for name in ("save", "convert", "export"):
        folder = tmp_path / name
        folder.mkdir()
        writers.append(folder)
    save_dest = writers[0] / "latest.zckpt"
    convert_dest = writers[1] / "latest.zckpt"
    export_dest = writers[2] / "latest.pt"
    zckpt.save(expected[1], save_dest)
    zckpt.save(expected[1], convert_dest)
    torch.save(expected[1], export_dest)
    kinds = [
        Writer("zckpt.save", writers[0], save_dest,
               lambda: subprocess.Popen([sys.executable, "-c", SAVER, "2", str(save_dest)], stdout=subprocess.PIPE,
                                        text=True), check_container),
        Writer("zckpt convert --force", writers[1], convert_dest,
               quiet([bin_, "convert", "--quiet", "--force", str(src_pt), "-o", str(convert_dest)]), check_container),
        Writer("zckpt export --force", writers[2], export_dest,
               quiet([bin_, "export", "--force", str(src_z), "-o", str(export_dest)]), check_pt),
    ]
    tmpfile = _has_tmpfile(str(tmp_path))
    totals = {"kills": 0, "torn": 0, "left_after_kill": 0, "left_after_next_writer": 0}
    for w in kinds:
        keep = {os.path.basename(w.dest)}
        # How long one whole write takes here (the kills spread over it), old destination put back after.
        seconds = w.run_whole()
        w.check(w.dest)
        figures = _kill_and_count(w, seconds, rng, keep)
        # The next writer in the folder (another destination) sweeps what the kills left.
        zckpt.save({"step": 0}, w.folder / "next.zckpt")
        left = sorted(set(os.listdir(w.folder)) - keep - {"next.zckpt"})
        figures["left_after_next_writer"] = len(left)
        print(f"\n{w.name}: {figures} (one whole write {seconds:.2f} s, O_TMPFILE {'yes' if tmpfile else 'no'})")
        for k in totals:
            totals[k] += figures[k]
        assert figures["torn"] == 0, f"{w.name}: {figures['torn']} torn destinations"
        assert not left, f"{w.name}: the next writer left {left}"
        if tmpfile:
            # Only a kill in the instant between link and rename leaves a (named, swept) file.
            assert figures["left_after_kill"] <= 2, f"{w.name}: {figures['left_after_kill']} of {KILLS} kills left a file"
    print(f"\ntotal: {totals}")


def _left(folder, keep):
    """Every entry below `folder` that is not in `keep` (relative paths)."""
    out = set()
    for root, dirs, names in os.walk(folder):
        for n in names + dirs:
            rel = os.path.relpath(os.path.join(root, n), folder)
            if rel not in keep:
                out.add(rel)
    return out


DCP_SAVER = textwrap.dedent("""
    import sys, torch, torch.distributed.checkpoint as dcp
    from zckpt.dcp import ZckptStorageWriter
    g = torch.Generator().manual_seed(2)
    dcp.save({"model": {"w": torch.randn(%d, generator=g)}}, storage_writer=ZckptStorageWriter(sys.argv[1]))
""" % (MB * 2**20 // 4))


@pytest.mark.parametrize("kind", ["merge", "reshard", "dcp"])
def test_merge_reshard_and_dcp_killed_at_random_moments_leave_nothing(tmp_path, kind):
    """The same for `zckpt merge` (a DCP folder to one container), `python -m zckpt reshard`
    (whose merged container and new ranks' .pt files live in a work folder inside the output
    folder, named with its pid and locked: the next reshard removes a killed one's) and a DCP
    save through ZckptStorageWriter (one process, killed anywhere in its run)."""
    rng = random.Random({"merge": 23, "reshard": 24, "dcp": 25}[kind])
    kills = 6
    src, out = tmp_path / "src", tmp_path / "out"
    out.mkdir()
    if kind == "merge":
        import torch.distributed.checkpoint as dcp

        from zckpt.dcp import ZckptStorageWriter
        dcp.save({"model": _state(2)}, storage_writer=ZckptStorageWriter(str(src)))
        cmd = [_zckpt_bin(), "merge", str(src), "-o", str(out / "model.zckpt"), "--force"]
    elif kind == "dcp":
        cmd = [sys.executable, "-c", DCP_SAVER, str(out / "step")]
    else:
        src.mkdir()
        for r in range(2):
            torch.save({"w": torch.randn(MB * 2**20 // 8)}, src / f"model_world_size_2_rank_{r}.pt")
        cmd = [sys.executable, "-m", "zckpt", "reshard", str(src), "--world-size", "2", "-o", str(out), "--format",
               "zckpt", "--force"]

    def whole():
        t = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return time.monotonic() - t

    seconds = whole()
    keep = _left(out, set()) - {n for n in _left(out, set()) if ".zckpt-" in n}
    assert keep and not (_left(out, set()) - keep), "a whole run left something"
    left_after_kill, earlier = 0, set()
    for _ in range(kills):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, seconds))
        p.kill()
        p.wait()
        left = _left(out, keep)
        left_after_kill += len({n.split(os.sep)[0] for n in left} - earlier)
        earlier = {n.split(os.sep)[0] for n in left}
        for n in left:
            assert ".zckpt-tmp-" in n or ".zckpt-reshard-" in n, f"{kind}: a kill left {n!r}"
    whole()  # the next run sweeps what the kills left
    left = _left(out, keep)
    print(f"\n{kind}: kills {kills}, left after the kill {left_after_kill}, left after the next run {len(left)} "
          f"(one whole run {seconds:.2f} s)")
    assert not left, f"{kind}: the next run left {sorted(left)}"


def test_reshard_removes_a_dead_reshards_work_folder_and_keeps_a_live_ones(tmp_path):
    import fcntl

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    for r in range(2):
        torch.save({"w": torch.randn(1024)}, src / f"model_world_size_2_rank_{r}.pt")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f".zckpt-reshard-{dead.pid}-x1"  # what a reshard killed with SIGKILL leaves
    stale.mkdir()
    (stale / "merged.zckpt").write_bytes(b"x" * 4096)
    live = out / f".zckpt-reshard-{os.getpid()}-x2"  # a reshard still running (holds the lock)
    live.mkdir()
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.utime(live, (time.time() - 3600, time.time() - 3600))  # old, but locked
        # In a process of its own, as `zckpt reshard` runs it (it needs no process group of this one's).
        r = subprocess.run([sys.executable, "-m", "zckpt", "reshard", str(src), "--world-size", "2", "-o", str(out),
                            "--force"], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not stale.exists(), "a dead reshard's work folder survived the next reshard"
        assert live.exists(), "a live reshard's work folder was removed"
    finally:
        os.close(fd)
    assert sorted(os.listdir(out)) == sorted([live.name, "model_world_size_2_rank_0.zckpt",
                                              "model_world_size_2_rank_1.zckpt"])
