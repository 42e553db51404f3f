"""DCP save and load through zckpt's storage layer vs DCP's own FileSystemWriter/Reader.

    meson devenv -C build python tools/bench/bench_dcp.py [--gib 1] [--rounds 3] [--world 2]

A state of DTensors (Shard(0) over `world` gloo ranks on the CPU, `gib` GiB in all) is saved
and loaded back by both storage layers, interleaved round by round (the machines here are shared
and noisy); each time is the slowest rank's, between barriers. Prints medians and the ratio
zckpt / FileSystemWriter (below 1: zckpt faster). Page cache is warm for loads (both read what
was just written), as a resume right after a save would be; fsync is on for both writers.
"""
import argparse
import os
import shutil
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def _state(mesh, gib, seed):
    from torch.distributed.tensor import Shard, distribute_tensor

    n = 8
    rows = int(gib * (1 << 30) / 4 / n / 1024)
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": distribute_tensor(torch.randn(rows, 1024, generator=g), mesh, [Shard(0)])
            for i in range(n)}


def _timed(fn):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def worker(rank, world, port, root, gib, rounds, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter

    mesh = init_device_mesh("cpu", (world,))
    state = _state(mesh, gib, 0)
    target = _state(mesh, gib, 1)
    layers = {
        "zckpt": (lambda p: ZckptStorageWriter(p), lambda p: ZckptStorageReader(p)),
        "filesystem": (lambda p: dcp.FileSystemWriter(p), lambda p: dcp.FileSystemReader(p)),
    }
    times = {f"{k}_{op}": [] for k in layers for op in ("save", "load")}
    for r in range(rounds):
        order = list(layers) if r % 2 == 0 else list(reversed(layers))
        for name in order:
            writer, reader = layers[name]
            path = f"{root}/{name}"
            if rank == 0 and os.path.exists(path):
                shutil.rmtree(path)
            dist.barrier()
            times[f"{name}_save"].append(_timed(lambda: dcp.save(state, storage_writer=writer(path))))
            times[f"{name}_load"].append(_timed(lambda: dcp.load(target, storage_reader=reader(path))))
            for k in state:
                assert torch.equal(state[k].to_local(), target[k].to_local()), k
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr(times))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="zckpt-bench-dcp-", dir=args.dir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(root, "times.txt")
    try:
        mp.spawn(worker, args=(args.world, port, root, args.gib, args.rounds, out), nprocs=args.world)
        times = eval(open(out).read())  # written by rank 0 above
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    gb = args.gib * (1 << 30) / 1e9
    print(f"DCP, {args.gib} GiB of DTensors over {args.world} ranks, {args.rounds} interleaved rounds (medians):")
    for op in ("save", "load"):
        z, f = med[f"zckpt_{op}"], med[f"filesystem_{op}"]
        print(f"  {op}: zckpt {z:.2f} s ({gb / z:.2f} GB/s), FileSystem {f:.2f} s ({gb / f:.2f} GB/s), "
              f"ratio zckpt/FileSystem {z / f:.2f}")


if __name__ == "__main__":
    main()
