"""The motivating failure, reproduced on a CUDA host, and zckpt's way out.

A resume beside an inference engine: the model (the destination) already lives on the GPU and
ballast holds the rest of the card but a little. A shard saved from CUDA tensors:
  - torch.load(path) revives every storage on cuda:0: a second full copy -> out of memory;
  - zckpt.load_into(container, model) streams into the existing tensors: no extra device memory.
Then, with the destination not yet allocated and only destination + one chunk free,
zckpt.load(container, map_location='cuda') builds new tensors without running out either.
Writes a JSON report (--out).
"""
import argparse
import gc
import json
import os
import subprocess
import time

import torch

import zckpt


def free_bytes():
    free, _ = torch.cuda.mem_get_info()
    return free


def fill_ballast(leave_free):
    """Allocates 64 MiB blocks until about `leave_free` bytes are free; returns them."""
    blocks, block = [], 64 << 20
    while free_bytes() - block > leave_free:
        blocks.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    return blocks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zckpt", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    os.makedirs(args.workdir, exist_ok=True)
    pt = os.path.join(args.workdir, "model_world_size_1_rank_0.pt")
    zc = os.path.join(args.workdir, "model_world_size_1_rank_0.zckpt")
    report = {"gib": args.gib}

    # A shard saved from CUDA tensors, as FSDP2 saves local shards.
    n = int(args.gib * 2**30 / (8192 * 8192 * 2))
    torch.manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for i in range(n)}
    torch.save(state, pt)
    reference = {k: v.float().sum().item() for k, v in state.items()}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    report["shard_bytes"] = nbytes
    t0 = time.perf_counter()
    subprocess.run([args.zckpt, "convert", pt, "-o", zc, "--quiet", "--force"], check=True)
    report["convert_seconds"] = time.perf_counter() - t0

    # Case 1: the destination exists, the card is otherwise full but 1 GiB.
    model = {k: torch.zeros_like(v) for k, v in state.items()}
    del state
    gc.collect()
    torch.cuda.empty_cache()
    ballast = fill_ballast(1 << 30)
    report["free_before"] = free_bytes()
    try:
        torch.load(pt, weights_only=True)
        report["torch_load"] = "loaded (no OOM)"
    except torch.OutOfMemoryError as e:
        report["torch_load"] = "OutOfMemoryError: " + str(e).splitlines()[0]
    gc.collect()
    torch.cuda.empty_cache()
    ptrs = {k: v.data_ptr() for k, v in model.items()}
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    zckpt.load_into(zc, model)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    report["load_into"] = {
        "seconds": secs,
        "GBps": nbytes / secs / 1e9,
        "extra_device_bytes": torch.cuda.max_memory_allocated() - before,
        "data_ptr_kept": all(ptrs[k] == v.data_ptr() for k, v in model.items()),
        "values_equal": all(abs(model[k].float().sum().item() - s) < 1e-3 * max(1.0, abs(s)) for k, s in reference.items()),
    }
    del ballast, model
    gc.collect()
    torch.cuda.empty_cache()

    # Case 2: no destination yet; only destination + one chunk (+ allocator slack) free.
    chunk = 4 << 20
    ballast = fill_ballast(nbytes + chunk + (256 << 20))
    report["free_before_load"] = free_bytes()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    try:
        loaded = zckpt.load(zc, map_location="cuda")
        torch.cuda.synchronize()
        report["load"] = {
            "seconds": time.perf_counter() - t0,
            "peak_minus_destination": torch.cuda.max_memory_allocated() - before - nbytes,
            "values_equal": all(abs(loaded[k].float().sum().item() - s) < 1e-3 * max(1.0, abs(s)) for k, s in reference.items()),
        }
    except torch.OutOfMemoryError as e:
        report["load"] = "OutOfMemoryError: " + str(e).splitlines()[0]
    print(json.dumps(report, indent=2))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
