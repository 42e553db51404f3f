"""Runs zckpt end to end on a checkpoint shard it writes itself (see tools/run-sample.sh)."""
import argparse
import os
import shutil
import subprocess
import sys
import time

import torch


def step(title):
    print(f"\n== {title}", flush=True)


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def deep_equal(a, b, path="root"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and type(a) is type(b), path
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), path
        assert a.storage_offset() == b.storage_offset(), path
        assert torch.equal(a, b) if not a.is_floating_point() else torch.equal(a.nan_to_num(), b.nan_to_num()), path
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a.keys()) == list(b.keys()), path
        for k in a:
            deep_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            deep_equal(x, y, f"{path}.{i}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zckpt", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    pt = os.path.join(args.workdir, "model_world_size_1_rank_0.pt")
    zc = os.path.join(args.workdir, "model_world_size_1_rank_0.zckpt")
    back = os.path.join(args.workdir, "exported.pt")

    step("write a sample shard with torch.save")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(args.layers)]).to(torch.bfloat16)
    model[1].weight = model[0].weight  # tied weights: one storage, two names
    state = model.state_dict()
    torch.save(state, pt)
    print(f"{pt}: {os.path.getsize(pt) / 2**20:.1f} MiB, {len(state)} tensors")

    step("convert (.pt -> .zckpt, no Python executed)")
    run([args.zckpt, "convert", "--force", pt, "-o", zc])
    step("verify")
    run([args.zckpt, "verify", zc])
    step("ls")
    run([args.zckpt, "ls", zc])
    step("load into CPU tensors")
    run([args.zckpt, "load", zc, "--device", "cpu"])
    step("export back to .pt and compare with the original")
    run([args.zckpt, "export", "--force", zc, "-o", back])
    original = torch.load(pt, weights_only=True)
    again = torch.load(back, weights_only=True)
    deep_equal(original, again)
    assert again["1.weight"].data_ptr() == again["0.weight"].data_ptr(), "aliasing lost"
    print("exported .pt loads equal to the original, tied weights still shared")
    print("\nsample OK")


if __name__ == "__main__":
    sys.exit(main())
