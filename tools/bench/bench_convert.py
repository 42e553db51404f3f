#!/usr/bin/env python3
"""Benchmark of `zckpt convert` against copying the same file, measured in one run.

Writes a torch shard of about --size-gib GiB with LLM-like shapes (bf16 attention/MLP weights,
f32 norms, some layers kept in f32 as mixed-precision checkpoints do), then measures, best of
--repeat each:

  cp           cp SRC NEW && fsync(NEW)         (zckpt fsyncs what it writes: so does the baseline)
  convert      zckpt convert SRC -o NEW         (default options)
  convert-zstd zckpt convert --zstd 3 SRC -o NEW
  verify       zckpt verify CONVERTED
  cat          cat SRC > /dev/null              (read throughput of the source)
  zckpt-start  zckpt --version                  (the tool's fixed start-up cost, in every zckpt row)

Every write goes to a new file (the previous one is deleted first). GB/s is source bytes per
second (verify: container bytes). Targets: convert <= 2x cp, verify <= cp.

Page cache: nothing is dropped that this user cannot drop. By default the source stays cached
(it was just written); with --cold each measurement first fsyncs and evicts the files it reads
with posix_fadvise(DONTNEED), which works without privileges for clean pages of one's own
files. Before each measurement the script records how much of the file it reads is resident
(fincore, when installed), and prints it, so the state is reported, not assumed.

Usage: bench_convert.py [--zckpt PATH] [--dir DIR] [--size-gib 1] [--repeat 3] [--cold] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_shard(path: str, target_bytes: int) -> dict:
    """A Llama-like state_dict of about target_bytes saved at path; returns a description."""
    import torch

    sd, info = llama_state_dict(target_bytes)
    torch.save(sd, path)
    return info


def llama_state_dict(target_bytes: int):
    """(state_dict, description): Llama-like shapes, about target_bytes of tensors (also used by
    bench_save.py)."""
    import collections

    import torch

    hidden, inter, vocab = 2048, 5632, 32000
    g = torch.Generator().manual_seed(0)
    sd = collections.OrderedDict()
    total = 0

    def add(name, shape, dtype):
        nonlocal total
        t = torch.randn(*shape, generator=g, dtype=torch.float32).mul_(0.02).to(dtype)
        sd[name] = t
        total += t.numel() * t.element_size()

    add("model.embed_tokens.weight", (vocab, hidden), torch.bfloat16)
    layer = 0
    while total < target_bytes - vocab * hidden * 2:
        # Every fourth layer in f32 (master weights / unconverted layers); norms always f32.
        dt = torch.float32 if layer % 4 == 3 else torch.bfloat16
        p = f"model.layers.{layer}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            add(p + f"self_attn.{n}.weight", (hidden, hidden), dt)
        add(p + "mlp.gate_proj.weight", (inter, hidden), dt)
        add(p + "mlp.up_proj.weight", (inter, hidden), dt)
        add(p + "mlp.down_proj.weight", (hidden, inter), dt)
        add(p + "input_layernorm.weight", (hidden,), torch.float32)
        add(p + "post_attention_layernorm.weight", (hidden,), torch.float32)
        layer += 1
    add("model.norm.weight", (hidden,), torch.float32)
    add("lm_head.weight", (vocab, hidden), torch.bfloat16)
    return sd, {"tensors": len(sd), "layers": layer, "tensor_bytes": total}


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(path):
    """Drops the clean cached pages of one file (after fsync). Needs no privilege."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident(path):
    """Fraction of the file in the page cache, via fincore; None when unknown."""
    if not shutil.which("fincore"):
        return None
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", path],
                             capture_output=True, text=True, check=True).stdout.split()
        res, size = int(out[0]), int(out[1])
        return res / size if size else 1.0
    except (subprocess.CalledProcessError, ValueError, IndexError):
        return None


class Bench:
    def __init__(self, args, src, work):
        self.args, self.src, self.work = args, src, work
        self.results = {}

    def measure(self, name, command, reads=None, writes=None):
        """Best of --repeat wall times of `command` (a list, or a str for the shell), which reads
        the file `reads` (GB/s is its size per second) and writes the new file `writes`."""
        times, cache = [], []
        for _ in range(self.args.repeat):
            if writes and os.path.exists(writes):
                os.remove(writes)
            if reads and self.args.cold:
                evict(reads)
            cache.append(resident(reads) if reads else None)
            t0 = time.perf_counter()
            subprocess.run(command, shell=isinstance(command, str), check=True, stdout=subprocess.DEVNULL)
            if name == "cp":
                fsync_path(writes)
            times.append(time.perf_counter() - t0)
        self.results[name] = {"seconds": min(times), "all_seconds": times,
                              "bytes": os.path.getsize(reads) if reads else 0, "resident_before": cache}
        r = self.results[name]
        r["gbps"] = r["bytes"] / r["seconds"] / 1e9 if r["bytes"] else 0.0
        return r

    def run(self):
        z, src, w = self.args.zckpt, self.src, self.work
        copy = os.path.join(w, "copy.pt")
        dst = os.path.join(w, "shard.zckpt")
        dstz = os.path.join(w, "shard-zstd.zckpt")
        # The tool's fixed cost per run (process start, shared libraries), part of every zckpt row.
        self.measure("zckpt-start", [z, "--version"])
        self.measure("cp", ["cp", src, copy], reads=src, writes=copy)
        os.remove(copy)
        self.measure("convert", [z, "convert", "--quiet", src, "-o", dst], reads=src, writes=dst)
        self.measure("convert-zstd", [z, "convert", "--quiet", "--zstd", "3", src, "-o", dstz], reads=src, writes=dstz)
        self.results["convert-zstd"]["output_bytes"] = os.path.getsize(dstz)
        self.results["convert"]["output_bytes"] = os.path.getsize(dst)
        os.remove(dstz)
        self.measure("verify", [z, "verify", "--quiet", dst], reads=dst)
        self.measure("cat", f"cat '{src}' > /dev/null", reads=src)
        cp = self.results["cp"]["seconds"]
        for r in self.results.values():
            r["ratio_vs_cp"] = r["seconds"] / cp
        return self.results


def report(results, info, args):
    print(f"source: {info['path']} ({info['bytes'] / 2**30:.2f} GiB, {info['tensors']} tensors, "
          f"{info['layers']} layers), repeat {args.repeat}, best time shown, "
          f"{'cold: source evicted before each run' if args.cold else 'warm: nothing evicted'}")
    print(f"{'step':<13} {'seconds':>8} {'GB/s':>7} {'x cp':>6}  {'cached before (per run)':<26} notes")
    for name, r in results.items():
        cache = ",".join("-" if c is None else f"{c:.0%}" for c in r["resident_before"])
        note = ""
        if "output_bytes" in r:
            note = f"output {r['output_bytes'] / 2**30:.3f} GiB ({r['output_bytes'] / r['bytes']:.3f} of source)"
        print(f"{name:<13} {r['seconds']:>8.3f} {r['gbps']:>7.2f} {r['ratio_vs_cp']:>6.2f}  {cache:<26} {note}")
    conv, ver = results["convert"]["ratio_vs_cp"], results["verify"]["ratio_vs_cp"]
    print(f"target convert <= 2x cp: {'met' if conv <= 2 else 'MISSED'} ({conv:.2f}x); "
          f"target verify <= cp: {'met' if ver <= 1 else 'MISSED'} ({ver:.2f}x)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zckpt", default=os.environ.get("ZCKPT_BIN") or os.path.join(REPO, "build", "tools", "zckpt"))
    ap.add_argument("--dir", default=None, help="working folder (default: a new temporary folder, removed after)")
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="evict the file each step reads before each run")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()
    if not os.access(args.zckpt, os.X_OK):
        sys.exit(f"bench_convert: no zckpt binary at {args.zckpt} (--zckpt or ZCKPT_BIN)")
    work = args.dir or tempfile.mkdtemp(prefix="zckpt-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        src = os.path.join(work, "shard.pt")
        t0 = time.perf_counter()
        info = make_shard(src, int(args.size_gib * 2**30))
        fsync_path(src)
        info.update(path=src, bytes=os.path.getsize(src), write_seconds=time.perf_counter() - t0)
        results = Bench(args, src, work).run()
        report(results, info, args)
        if args.json:
            print(json.dumps({"source": info, "cold": args.cold, "results": results}, indent=1))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
