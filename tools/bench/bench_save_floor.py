#!/usr/bin/env python3
"""zckpt.save against its floor, alternating in one process (issue 46's target: <= 1.2x).

bench_save.py runs each contender in a fresh process, which adds each process's own history
(its torch.load of the source, its first save) to the noise of a shared machine; here one
process holds one Llama-like state dict (bench_convert's shapes, about --gib GiB) and saves it
--rounds times with each contender, in a shuffled order each round, the disk synced between runs
(outside the timing), under two conditions (--condition, default both):

  fresh      each run writes a new file: the previous output was fsynced and removed first
             (a trainer writing checkpoint-N folders)
  replace    each run replaces its contender's output of the round before, which stays in
             place (a trainer saving last.ckpt again): torch.save and the floor truncate it and
             reuse its page-cache pages at once, zckpt.save writes beside it and renames over it

Contenders:

  zckpt.save          zckpt.save(sd, dst): temporary file, fsync, rename, folder fsync
  write+fsync         the floor: one write(2) per storage from its memory, then fsync
                      (bench_save.write_fsync)
  torch.save+fsync    torch.save(sd, dst), then fsync

Reports medians, [min, max], and zckpt.save's ratio to each, paired round by round (median).

Usage: python tools/bench/bench_save_floor.py [--gib 1] [--rounds 7] [--condition both] [--dir DIR]
(run inside `meson devenv -C build` so `import zckpt` finds the build)
"""
import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_convert import fsync_path, llama_state_dict  # noqa: E402
from bench_save import GIB, settle, write_fsync  # noqa: E402


def torch_save_fsync(sd, dst):
    import torch

    torch.save(sd, dst)
    fsync_path(dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--condition", choices=("fresh", "replace", "both"), default="both")
    ap.add_argument("--dir", default=None, help="working folder (default: a new temporary folder, removed after)")
    args = ap.parse_args()

    import zckpt

    contenders = {"zckpt.save": zckpt.save, "write+fsync": write_fsync, "torch.save+fsync": torch_save_fsync}
    conditions = ["fresh", "replace"] if args.condition == "both" else [args.condition]
    work = args.dir or tempfile.mkdtemp(prefix="zckpt-bench-save-floor-")
    os.makedirs(work, exist_ok=True)
    outputs = {kind: os.path.join(work, f"out{i}") for i, kind in enumerate(contenders)}
    runs = {(c, k): [] for c in conditions for k in contenders}
    try:
        sd, info = llama_state_dict(int(args.gib * GIB))
        rng = random.Random(46)
        for r in range(args.rounds):
            order = [(c, k) for c in conditions for k in contenders]
            rng.shuffle(order)
            for condition, kind in order:
                dst = outputs[kind]
                if condition == "fresh" or not os.path.exists(dst):
                    settle(dst)
                else:
                    fsync_path(dst)
                    os.sync()
                    time.sleep(1)
                t0 = time.perf_counter()
                contenders[kind](sd, dst)
                runs[condition, kind].append(time.perf_counter() - t0)
            print(f"round {r + 1}/{args.rounds}: " +
                  ", ".join(f"{c} {k} {v[-1]:.3f} s" for (c, k), v in runs.items()), file=sys.stderr)
        for dst in outputs.values():
            settle(dst)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"state dict: {info['tensor_bytes'] / GIB:.2f} GiB in {info['tensors']} tensors; {args.rounds} rounds in one "
          f"process, contenders and conditions interleaved; medians [min, max]; zckpt.save / it paired round by "
          f"round (median)")
    for condition in conditions:
        z = runs[condition, "zckpt.save"]
        print(f"{condition}:")
        for k in contenders:
            v = runs[condition, k]
            paired = statistics.median(a / b for a, b in zip(z, v))
            print(f"  {k:<20} {statistics.median(v):>7.3f} s [{min(v):.3f}, {max(v):.3f}]  zckpt.save / it "
                  f"{paired:.2f}x")


if __name__ == "__main__":
    main()
