"""Two processes saving to one path at once (issue 22, part 3).

The rule (src/common/atomic_file.h, docs/writers.md): each save is whole, the last rename wins,
and a save that finds at its commit that another writer replaced the destination since it began
still commits and says so on stderr ("... last rename wins"). Two processes save their own
checkpoint to the same path in a loop while this one loads it: every load, and the final file,
is one of the two checkpoints exactly; both writers succeed; each warning names the path; nothing
else is left in the folder. Bounded: 12 saves per writer.
"""
import os
import subprocess
import sys
import textwrap
import time

import torch

import zckpt

SAVES = 12

WRITER = textwrap.dedent("""
    import os, sys, time, torch, zckpt
    step, dest, go = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    g = torch.Generator().manual_seed(step)
    state = {"step": step, "w": torch.randn(2**20, generator=g)}
    open(go + str(step), "w").close()  # ready: torch imported, state built
    while not os.path.exists(go):
        time.sleep(0.001)
    for _ in range(%d):
        zckpt.save(state, dest)
""" % SAVES)


def _state(step):
    g = torch.Generator().manual_seed(step)
    return {"step": step, "w": torch.randn(2**20, generator=g)}


def test_two_processes_saving_one_path_give_one_whole_checkpoint(tmp_path):
    dest, go = tmp_path / "latest.zckpt", tmp_path / "go"
    want = {1: _state(1), 2: _state(2)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(s), str(dest), str(go)], stderr=subprocess.PIPE,
                                text=True) for s in (1, 2)]
    while not all(os.path.exists(f"{go}{s}") for s in (1, 2)):  # both ready, then both at once
        assert all(w.poll() is None for w in writers), "a writer died before saving"
        time.sleep(0.005)
    go.touch()
    loads = 0
    while any(w.poll() is None for w in writers) and loads < 200:
        if dest.exists():
            got = zckpt.load(dest)
            assert torch.equal(got["w"], want[got["step"]]["w"]), f"load {loads}: not checkpoint {got['step']}"
            loads += 1
        else:
            time.sleep(0.001)
    errs = [w.communicate(timeout=120)[1] for w in writers]
    for w, err in zip(writers, errs):
        assert w.returncode == 0, err
        for line in err.splitlines():
            if line.startswith("zckpt: warning:"):
                assert str(dest) in line and "last rename wins" in line, line
    final = zckpt.load(dest)
    assert torch.equal(final["w"], want[final["step"]]["w"])
    assert sorted(os.listdir(tmp_path)) == ["go", "go1", "go2", "latest.zckpt"]
    print(f"\n{loads} loads while racing; warnings: {sum(e.count('last rename wins') for e in errs)}")
