#!/usr/bin/env python3
"""safetensors benchmark: converting a safetensors file with `zckpt convert`, and loading its
container, against safetensors' own `load_file` + reading every byte, in one run.

Writes a safetensors file of about --gib GiB (a 1B-class decoder's shapes: bf16 weights, f32
norms) with safetensors itself, then times, each in a process of its own, over --rounds rounds
whose order rotates (so no contender always runs first or last on a shared machine), and
reports medians:

  convert            zckpt convert --force FILE.safetensors -o FILE.zckpt (fsynced, checksummed)
  zckpt.load+read    zckpt.load(FILE.zckpt) (every chunk's XXH3 checked) then a sum over every
                     byte of every tensor (8 bytes at a time, wrapping)
  zckpt.load mmap    zckpt.load(FILE.zckpt, mmap=True) then the same sum
  zckpt load (C++)   `zckpt load FILE.zckpt` (the C++ loader, checksums checked; no sum)
  safetensors        safetensors.torch.load_file(FILE) then the same sum (load_file maps the file
                     lazily: the sum is where its bytes are read)
  read(2)            the .safetensors file read into fresh memory (the floor for any loader)

Both files stay in the page cache (read once before the rounds): the figures compare the work
each side does with the bytes, not the disk. Ratios are against `safetensors` (load_file + sum),
measured in the same rounds.

Usage: python tools/bench/bench_safetensors.py [--zckpt build/tools/zckpt] [--gib 1] [--rounds 5]
                                               [--workdir DIR] [--out results.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GIB = 1 << 30


# ---------------------------------------------------------------- child side (one measurement)

def touch_every_byte(state):
    """Reads every byte of every tensor (a wrapping int64 sum of its bytes: memory-bound, and the
    same number for the same bytes whoever loaded them)."""
    import torch

    total = 0
    for t in state.values():
        if not t.numel():
            continue
        b = t.contiguous().view(-1).view(torch.uint8)
        whole = b.numel() // 8 * 8
        if whole:
            total += int(b[:whole].view(torch.int64).sum())
        total += int(b[whole:].sum(dtype=torch.int64))
    return total & ((1 << 64) - 1)


def child(kind, path):
    # Imports first: the timing covers the load and the sum, not the interpreter's start.
    import numpy as np
    import torch  # noqa: F401
    from safetensors.torch import load_file

    import zckpt

    t0 = time.perf_counter()
    if kind == "zckpt_py":
        state = zckpt.load(path)
    elif kind == "zckpt_py_mmap":
        state = zckpt.load(path, mmap=True)
    elif kind == "safetensors":
        state = load_file(path)
    elif kind == "read":
        buf = np.empty(os.path.getsize(path), dtype=np.uint8)
        with open(path, "rb", buffering=0) as f:
            f.readinto(memoryview(buf))
        print(json.dumps({"seconds": time.perf_counter() - t0, "sum": None}))
        return 0
    else:
        raise SystemExit(f"unknown child {kind}")
    loaded = time.perf_counter() - t0
    checksum = touch_every_byte(state)
    print(json.dumps({"seconds": time.perf_counter() - t0, "load_seconds": loaded, "sum": checksum}))
    return 0


# ---------------------------------------------------------------- parent side

def make_file(path, gib):
    import torch
    from safetensors.torch import save_file

    if os.path.exists(path):
        return
    g = torch.Generator().manual_seed(0)
    hidden, inter = 2048, 5632
    sd = {"model.embed_tokens.weight": torch.randn(32000, hidden, generator=g).to(torch.bfloat16)}
    layer = 0
    while sum(t.numel() * t.element_size() for t in sd.values()) < gib * GIB:
        p = f"model.layers.{layer}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + "self_attn." + name + ".weight"] = torch.randn(hidden, hidden, generator=g).to(torch.bfloat16)
        for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
            sd[p + "mlp." + name + ".weight"] = torch.randn(*shape, generator=g).to(torch.bfloat16)
        sd[p + "input_layernorm.weight"] = torch.ones(hidden)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
        layer += 1
    save_file(sd, path, metadata={"format": "pt"})


def timed(cmd, env=None):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    return seconds, out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--zckpt", default="build/tools/zckpt")
    ap.add_argument("--workdir", default="/tmp/zckpt-bench-safetensors")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="also write the measurements as JSON to this file")
    args = ap.parse_args()
    if args.child:
        return child(*args.child)

    env = dict(os.environ)
    package = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.zckpt))), "src", "python")
    env["PYTHONPATH"] = package + os.pathsep + env.get("PYTHONPATH", "")
    os.makedirs(args.workdir, exist_ok=True)
    st, zc = os.path.join(args.workdir, "model.safetensors"), os.path.join(args.workdir, "model.zckpt")
    make_file(st, args.gib)
    timed([args.zckpt, "convert", "--quiet", "--force", st, "-o", zc])
    size = os.path.getsize(st)
    for p in (st, zc):  # page cache warm for everyone
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass

    def py(kind, path):
        def run():
            seconds, out = timed([sys.executable, os.path.abspath(__file__), "--child", kind, path], env)
            return seconds, json.loads(out.strip().splitlines()[-1])
        return run

    contenders = {
        "convert": lambda: (timed([args.zckpt, "convert", "--quiet", "--force", st, "-o", zc])[0], {}),
        "zckpt.load+read": py("zckpt_py", zc),
        "zckpt.load mmap+read": py("zckpt_py_mmap", zc),
        "zckpt load (C++)": lambda: (timed([args.zckpt, "load", zc])[0], {}),
        "safetensors": py("safetensors", st),
        "read(2)": py("read", st),
    }
    names = list(contenders)
    results = {n: [] for n in names}
    sums = {}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            wall, info = contenders[n]()
            # Python children report their own time (without the interpreter's start); the CLI
            # rows are wall time of the whole process, start-up included.
            results[n].append(info.get("seconds", wall))
            if info.get("sum") is not None:
                sums.setdefault(n, set()).add(info["sum"])
        print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    distinct = {s for v in sums.values() for s in v}
    if len(distinct) > 1:
        raise SystemExit(f"the contenders read different bytes: {sums}")

    base = statistics.median(results["safetensors"])
    print(f"\n{size / GIB:.2f} GiB safetensors file, {args.rounds} rounds (order rotated), medians, page cache warm\n")
    print(f"{'':24} {'median s':>9} {'min s':>7} {'GB/s':>6} {'x safetensors':>14}")
    rows = []
    for n in names:
        med = statistics.median(results[n])
        rows.append({"name": n, "median_seconds": med, "seconds": results[n], "ratio_to_safetensors": med / base})
        print(f"{n:24} {med:9.3f} {min(results[n]):7.3f} {size / med / 1e9:6.2f} {med / base:14.2f}")
    print("\nx safetensors: median time over safetensors load_file + a sum over every byte (below 1: faster).")
    print("Python rows time the load and the sum inside the process (interpreter start excluded); the")
    print("zckpt CLI rows are whole-process wall time (start-up included).")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"bytes": size, "rounds": args.rounds, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
