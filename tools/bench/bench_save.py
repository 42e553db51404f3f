#!/usr/bin/env python3
"""Save benchmark: zckpt.save against torch.save, safetensors and cp, in one run.

Makes a Llama-like state dict of about --gib GiB (bench_convert's shapes), keeps it as a .pt
each measuring process loads first, then runs every contender --rounds times, interleaved (a
shuffled order each round), each run in a fresh process of its own, and reports medians:

  zckpt.save          zckpt.save(sd, dst)                         (fsyncs: durable when it returns)
  torch.save          torch.save(sd, dst); also + fsync(dst)      (torch does not fsync)
  safetensors         safetensors.torch.save_file(sd, dst); also + fsync(dst)
  torch.save+convert  torch.save(sd, tmp.pt) + zckpt.convert(tmp.pt, dst)   (the path zckpt.save replaces)
  async_save          zckpt.AsyncSaver().save(sd, dst): time until it returns (blocking) and until
                      its Future is done (full), with its buffer reused (the first call, which
                      allocates it, is reported too), against copying the same storages into
                      that buffer (faulted in): the snapshot's own copy alone (memcpy over up to
                      8 threads) and one libc memcpy per storage on one thread (ctypes.memmove,
                      "the snapshot's memcpy time"); 3 of each, interleaved, medians (its
                      seconds: the median full time)
  cp                  cp SAME dst && fsync(dst), SAME a file of the bytes zckpt.save writes, in
                      the page cache as the state dict is in memory
  write+fsync         the storages' bytes written from memory, one write(2) per storage (as
                      large as the kernel takes), then fsync: the floor (issue 46: zckpt.save
                      within 1.2x of it on ext4)

Each measuring process saves twice, as a training loop does (the first save's output fsynced,
deleted and synced in between): the second is the figure reported, the first is shown too
("1st in process"; async_save: its first call, which also allocates its buffer, then three
more, medians). Peak RSS is read by each measuring process itself: VmHWM after the step minus VmRSS before it
(the state dict already loaded; VmHWM reset through /proc/self/clear_refs), i.e. the memory the
steps added; cp's is its whole-process maximum (wait4). Every output is fsynced and deleted by
the parent between runs (outside the timing), so no run pays for another's dirty pages.

Targets (issue 17): zckpt.save >= 2x faster than torch.save, <= 1.2x cp; async blocking time <=
the snapshot's memcpy time. Issue 46: zckpt.save <= 1.2x write+fsync and no slower than
torch.save + fsync, on disk. The machine may be shared: compare ratios within one run.

Usage: python tools/bench/bench_save.py [--gib 1] [--rounds 3] [--dir DIR] [--kinds K,K,...] [--json]
(--kinds: a subset of the contenders, e.g. zckpt.save,torch.save,write+fsync; torch.save and
write+fsync are always run, as the report's ratios are against them)
(run inside `meson devenv -C build` so `import zckpt` finds the build)
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_convert import fsync_path, llama_state_dict  # noqa: E402
from contenders import host_memory, reset_peak  # noqa: E402

GIB = 1 << 30
KINDS = ["zckpt.save", "torch.save", "safetensors", "torch.save+convert", "async_save", "cp", "write+fsync"]
# The contenders every report holds: its ratios are against these.
BASE_KINDS = ["torch.save", "write+fsync"]


# ---------------------------------------------------------------- child side (one measurement)


def one_run(kind, sd, dst):
    """One timed save: {"seconds": ...} (and "seconds_fsync" for the writers that do not fsync)."""
    import torch
    import zckpt

    out = {}
    t0 = time.perf_counter()
    if kind == "zckpt.save":
        zckpt.save(sd, dst)
    elif kind in ("torch.save", "safetensors"):
        if kind == "torch.save":
            torch.save(sd, dst)
        else:
            from safetensors.torch import save_file

            save_file(sd, dst)
        out["seconds"] = time.perf_counter() - t0
        fsync_path(dst)
        out["seconds_fsync"] = time.perf_counter() - t0
        return out
    elif kind == "write+fsync":
        write_fsync(sd, dst)
    elif kind == "torch.save+convert":
        torch.save(sd, dst + ".pt")
        zckpt.convert(dst + ".pt", dst)
        os.remove(dst + ".pt")
    else:
        raise SystemExit(f"unknown kind {kind}")
    out["seconds"] = time.perf_counter() - t0
    return out


def write_fsync(sd, dst):
    """The floor: each storage's bytes straight from its memory, one write(2) per storage
    (repeated only for what the kernel did not take), then fsync."""
    import torch

    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for t in sd.values():
            view = memoryview(torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy())
            while len(view):
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def child(kind, src, dst):
    """Two saves in one process, as a training loop makes them: the first (its "first" figures)
    and the second (the figures reported), the first's output fsynced, deleted and synced in
    between (untimed)."""
    import torch

    sd = torch.load(src, weights_only=True)
    storages = [t.untyped_storage() for t in sd.values()]
    nbytes = sum(s.nbytes() for s in storages)
    reset_peak()
    before = host_memory()["VmRSS"]
    out = {"kind": kind, "bytes": nbytes}
    if kind == "async_save":
        out.update(async_child(sd, storages, dst))
    else:
        first = one_run(kind, sd, dst)
        settle(dst)
        out.update({"first_" + k: v for k, v in first.items()})
        out.update(one_run(kind, sd, dst))
    out["peak_rss_added"] = host_memory()["VmHWM"] - before
    print(json.dumps(out))


def async_child(sd, storages, dst, repeat=3):
    """The first call (it allocates and faults in the buffer), then `repeat` rounds of: a call
    with the buffer reused (blocking and full times), the snapshot's copy alone (its threaded
    memcpy), and one libc memcpy per storage on one thread, into the same (faulted-in) buffer.
    Medians."""
    import ctypes

    import torch
    import zckpt

    saver = zckpt.AsyncSaver()
    out = {}
    t0 = time.perf_counter()
    fut = saver.save(sd, dst)
    out["first_blocking"] = time.perf_counter() - t0
    fut.result()
    out["first_seconds"] = time.perf_counter() - t0
    buf = saver._buffer
    offset, spans = 0, []
    for s in storages:
        spans.append((offset, s, torch.empty(0, dtype=torch.uint8).set_(s)))
        offset += -(-s.nbytes() // 64) * 64
    dsts = [buf[off:off + s.nbytes()] for off, s, _ in spans]
    copies = [(d.data_ptr(), src.data_ptr(), d.numel()) for d, (_, _, src) in zip(dsts, spans) if d.numel()]
    rounds = {"blocking": [], "seconds": [], "memcpy_snapshot": [], "memcpy_libc": []}
    for _ in range(repeat):
        settle(dst)
        t0 = time.perf_counter()
        fut = saver.save(sd, dst)
        t1 = time.perf_counter()
        fut.result()
        rounds["blocking"].append(t1 - t0)
        rounds["seconds"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        zckpt._core.copy_host_bytes(copies)  # the snapshot's own copy, alone
        rounds["memcpy_snapshot"].append(time.perf_counter() - t0)
        base = buf.data_ptr()
        t0 = time.perf_counter()
        for off, s, _ in spans:
            ctypes.memmove(base + off, s.data_ptr(), s.nbytes())
        rounds["memcpy_libc"].append(time.perf_counter() - t0)
    out.update({k: statistics.median(v) for k, v in rounds.items()})
    out["buffer_bytes"] = saver.buffer_bytes
    saver.close()
    return out


# ---------------------------------------------------------------- parent side


def run_child(kind, src, dst, same):
    if kind == "cp":
        # cp's own peak RSS from GNU time (wait4 here would count this process's pages, shared
        # with the forked child until it execs cp). Two copies, as the other contenders save twice.
        timed = ["/usr/bin/time", "-f", "%M"] if os.access("/usr/bin/time", os.X_OK) else []
        seconds = []
        for _ in range(2):
            settle(dst)
            t0 = time.perf_counter()
            p = subprocess.run(timed + ["cp", same, dst], capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"cp failed: {p.stderr}")
            fsync_path(dst)
            seconds.append(time.perf_counter() - t0)
        rss = int(p.stderr.split()[-1]) * 1024 if timed else 0
        return {"kind": kind, "first_seconds": seconds[0], "seconds": seconds[1], "bytes": os.path.getsize(same),
                "peak_rss_total": rss}
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, "--src", src, "--dst", dst],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{p.stdout}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def settle(path):
    """The run's output, durable and gone, and the disk given a moment, outside the timing."""
    if os.path.exists(path):
        fsync_path(path)
        os.remove(path)
    os.sync()
    time.sleep(1)


def median(values):
    return statistics.median(values) if values else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="working folder (default: a new temporary folder, removed after)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated contenders (default: all)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--dst", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.src, args.dst)

    import torch
    import zckpt

    work = args.dir or tempfile.mkdtemp(prefix="zckpt-bench-save-")
    os.makedirs(work, exist_ok=True)
    try:
        sd, info = llama_state_dict(int(args.gib * GIB))
        src = os.path.join(work, "sd.pt")
        torch.save(sd, src)
        same = os.path.join(work, "same-bytes.zckpt")  # what zckpt.save writes, as cp's source
        zckpt.save(sd, same)
        del sd
        dst = os.path.join(work, "out")
        kinds = [k for k in KINDS if k in args.kinds.split(",") or k in BASE_KINDS]
        runs = {k: [] for k in kinds}
        rng = random.Random(17)
        for r in range(args.rounds):
            order = kinds[:]
            rng.shuffle(order)  # no contender always follows the same one (and its deleted file)
            for kind in order:
                runs[kind].append(run_child(kind, src, dst, same))
                settle(dst)
                print(f"round {r + 1}/{args.rounds} {kind}: {runs[kind][-1]['seconds']:.3f} s "
                      f"(1st in process {runs[kind][-1]['first_seconds']:.3f} s)", file=sys.stderr)
        report(runs, info, args, os.path.getsize(same))
        if args.json:
            print(json.dumps({"info": info, "runs": runs}, indent=1))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def report(runs, info, args, file_bytes):
    med = {k: median([r["seconds"] for r in v]) for k, v in runs.items()}
    tensor_bytes = info["tensor_bytes"]
    floor = med["write+fsync"]
    print(f"state dict: {tensor_bytes / GIB:.2f} GiB in {info['tensors']} tensors; container {file_bytes / GIB:.3f} GiB; "
          f"{args.rounds} rounds, contenders interleaved, each run a fresh process; medians")
    print(f"{'contender':<20} {'seconds':>8} {'GB/s':>6} {'vs torch.save':>13} {'vs floor':>8} {'peak RSS added':>15} "
          f"{'1st in process':>14}")
    for k in runs:
        rss = median([r.get("peak_rss_added", r.get("peak_rss_total", 0)) for r in runs[k]])
        first = median([r["first_seconds"] for r in runs[k]])
        note = " (whole cp process)" if k == "cp" else ""
        print(f"{k:<20} {med[k]:>8.3f} {tensor_bytes / med[k] / 1e9:>6.2f} {med['torch.save'] / med[k]:>12.2f}x "
              f"{med[k] / floor:>7.2f}x {rss / 2**20:>11.0f} MiB {first:>12.3f} s{note}")
    for k in ("torch.save", "safetensors"):
        if k not in runs:
            continue
        f = median([r["seconds_fsync"] for r in runs[k]])
        first = median([r["first_seconds_fsync"] for r in runs[k]])
        print(f"{k + ' + fsync':<20} {f:>8.3f} {tensor_bytes / f / 1e9:>6.2f} {med['torch.save'] / f:>12.2f}x "
              f"{f / floor:>7.2f}x {'':>15} {first:>12.3f} s")
    if "async_save" in runs:
        a = runs["async_save"]
        blocking, mt, ml = (median([r[x] for r in a]) for x in ("blocking", "memcpy_snapshot", "memcpy_libc"))
        first = median([r["first_blocking"] for r in a])
        print(f"async_save: blocks {blocking:.3f} s (first call, allocating its buffer: {first:.3f} s), done after "
              f"{med['async_save']:.3f} s; the same bytes copied alone: {mt:.3f} s (the snapshot's threaded memcpy), "
              f"{ml:.3f} s (one libc memcpy per storage); buffer {median([r['buffer_bytes'] for r in a]) / GIB:.3f} GiB")
        print(f"target (issue 17): async blocking <= memcpy: {blocking / ml:.2f}x libc memcpy "
              f"({blocking / mt:.2f}x the snapshot's own copy)")
    if "zckpt.save" in runs:
        fsync_torch = median([r["seconds_fsync"] for r in runs["torch.save"]])
        z = med["zckpt.save"]
        cp = f"; <= 1.2x cp: {z / med['cp']:.2f}x" if "cp" in runs else ""
        print(f"targets: >= 2x torch.save: {med['torch.save'] / z:.2f}x{cp}; issue 46: <= 1.2x write+fsync: "
              f"{z / floor:.2f}x, no slower than torch.save + fsync: {z / fsync_torch:.2f}x its time")


if __name__ == "__main__":
    main()
