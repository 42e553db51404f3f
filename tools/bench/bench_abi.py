"""What crossing into zckpt's core costs a many-range load: load_ranges with N ranges (10,000 by
default) through the package's own path (zckpt/_load_ranges.py -> _core.Checkpoint.load_ranges ->
libzckpt_core.so), against the loader's own time for the same call.

  meson devenv -C build ~/.cache/zckpt/venv/bin/python tools/bench/bench_abi.py [--ranges 10000]
      [--range-bytes 64] [--rounds 31] [--json]

One container of one f32 storage holding every range back to back (written by zckpt.save,
in --workdir or a temporary folder), page cache warm. Each round loads every range into one
host buffer (verify=False, one thread: the copy is range_bytes * N bytes of memcpy) and
times the Python call around it. The loader reports its own wall time (LoadStats' seconds:
planning, reading, copying); what is outside it, call - loader, is what the interface costs:
building the request, crossing, reading the answer. Prints the median and quartiles of the
call, the loader and call - loader, in milliseconds, over --rounds rounds (medians, not best).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranges", type=int, default=10_000)
    ap.add_argument("--range-bytes", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    import zckpt
    from zckpt import _core
    from zckpt._load_ranges import load_ranges

    n, size = args.ranges, args.range_bytes
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        path = os.path.join(tmp, "ranges.zckpt")
        zckpt.save({"w": torch.arange(n * size // 4, dtype=torch.float32)}, path)
        ckpt = _core.open(path)
        buf = _core.HostBuffer(n * size)
        ranges = [(0, i * size, (i + 1) * size, buf.address + i * size, -1) for i in range(n)]
        call, loader = [], []
        for _ in range(args.rounds + 1):
            t0 = time.perf_counter()
            stats = load_ranges(ckpt, ranges, verify=False, threads=1)
            call.append(time.perf_counter() - t0)
            loader.append(stats["seconds"])
        call, loader = call[1:], loader[1:]  # the first round warms the caches
        got = torch.frombuffer(buf, dtype=torch.float32)
        if not torch.equal(got, torch.arange(n * size // 4, dtype=torch.float32)):
            sys.exit("bench_abi: the loaded bytes differ from the saved ones")
        outside = [c - l for c, l in zip(call, loader)]

    def ms(xs):
        q = statistics.quantiles(xs, n=4)
        return {"median": 1e3 * statistics.median(xs), "q1": 1e3 * q[0], "q3": 1e3 * q[2]}

    report = {"ranges": n, "range_bytes": size, "rounds": args.rounds, "call_ms": ms(call),
              "loader_ms": ms(loader), "outside_loader_ms": ms(outside), "load_average": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(report))
        return
    print(f"{n} ranges of {size} bytes, {args.rounds} rounds (load average {report['load_average']:.2f})")
    for key in ("call_ms", "loader_ms", "outside_loader_ms"):
        r = report[key]
        print(f"  {key:18} median {r['median']:7.3f}  [q1 {r['q1']:.3f}, q3 {r['q3']:.3f}]")


if __name__ == "__main__":
    main()
