"""`zckpt merge` of verl per-rank shards vs the torch way (torch.load every shard, concatenate the
local tensors, save_file), time and peak RSS.

    meson devenv -C build python tools/bench/bench_merge.py [--gib 1] [--world 4] [--rounds 3]

Writes verl-style FSDP2 files (DTensor Shard(0) state dicts, torch.save'd per rank, made in this
one process under a fake process group) and their `zckpt convert`, then runs, interleaved round
by round, each contender in its own process so its peak RSS (ru_maxrss) is its own:
  zckpt-pt     zckpt merge DIR -o HF           (reads the .pt files directly)
  zckpt        zckpt merge DIR.zckpt -o HF      (the converted containers, every chunk checked)
  torch        python: torch.load(all shards) + torch.cat + safetensors save_file (verl's merger)
The outputs are compared tensor by tensor. Prints medians and ratios against torch. This driver
never imports torch itself (shards are written and outputs compared by child processes): a forked
child's ru_maxrss starts at its parent's RSS, so a big parent would inflate every figure.
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TORCH_MERGE = r"""
import sys, glob, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import torch.distributed.tensor
from safetensors.torch import save_file
src, out, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
shards = [torch.load(f"{src}/model_world_size_{world}_rank_{r}.pt", map_location="cpu", weights_only=True)
          for r in range(world)]
full = {k: torch.cat([s[k].to_local() for s in shards]) for k in shards[0]}
save_file(full, f"{out}/model.safetensors")
"""


COMPARE = r"""
import sys, torch
from safetensors.torch import load_file
want = load_file(sys.argv[1])
for path in sys.argv[2:]:
    got = load_file(path)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), path
print(max(t.numel() * t.element_size() for t in want.values()), sum(t.numel() * t.element_size() for t in want.values()))
"""


def _write_shards(root, gib, world):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    n = 16
    rows = int(gib * (1 << 30) / 2 / n / 2048) // world * world
    os.makedirs(f"{root}/pt", exist_ok=True)
    for r in range(world):
        dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=world)
        mesh = DeviceMesh("cpu", torch.arange(world), _init_backend=False)
        sd = {}
        for i in range(n):
            g = torch.Generator().manual_seed(i * 1000 + r)
            local = torch.randn(rows // world, 2048, generator=g).bfloat16()
            sd[f"model.layers.{i}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                                                  shape=(rows, 2048), stride=(2048, 1))
        torch.save(sd, f"{root}/pt/model_world_size_{world}_rank_{r}.pt")
        dist.destroy_process_group()


def _run(cmd):
    """Wall seconds and peak RSS (bytes) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed: {proc.stderr.read()}")
    return wall, usage.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--write-shards", nargs=3, help=argparse.SUPPRESS)  # ROOT GIB WORLD, in a child
    args = ap.parse_args()
    if args.write_shards:
        _write_shards(args.write_shards[0], float(args.write_shards[1]), int(args.write_shards[2]))
        return
    zckpt_bin = os.environ.get("ZCKPT_BIN") or shutil.which("zckpt")
    if not zckpt_bin:
        sys.exit("set ZCKPT_BIN to the built zckpt tool")
    root = tempfile.mkdtemp(prefix="zckpt-bench-merge-", dir=args.dir)
    try:
        subprocess.run([sys.executable, "-W", "ignore", __file__, "--write-shards", root, str(args.gib), str(args.world)],
                       check=True)
        subprocess.run([zckpt_bin, "convert", f"{root}/pt", "-o", f"{root}/z", "-q"], check=True)
        contenders = {
            "zckpt-pt": lambda out: [zckpt_bin, "merge", f"{root}/pt", "-o", out, "-q"],
            "zckpt": lambda out: [zckpt_bin, "merge", f"{root}/z", "-o", out, "-q"],
            "torch": lambda out: [sys.executable, "-c", TORCH_MERGE, f"{root}/pt", out, str(args.world)],
        }
        results = {k: [] for k in contenders}
        for r in range(args.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for name in order:
                out = f"{root}/out-{name}"
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out)
                results[name].append(_run(contenders[name](out)))
        outputs = [f"{root}/out-{n}/model.safetensors" for n in ("torch", "zckpt-pt", "zckpt")]
        compared = subprocess.run([sys.executable, "-c", COMPARE, *outputs], check=True, capture_output=True, text=True)
        largest, total = map(int, compared.stdout.split())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    gib = total / (1 << 30)
    print(f"merge of {args.world} verl FSDP2 shards, {gib:.2f} GiB model, largest tensor "
          f"{largest / (1 << 20):.0f} MiB, {args.rounds} interleaved rounds (medians):")
    t_torch = statistics.median(w for w, _ in results["torch"])
    rss_torch = statistics.median(m for _, m in results["torch"])
    for name, runs in results.items():
        w = statistics.median(x for x, _ in runs)
        m = statistics.median(x for _, x in runs)
        print(f"  {name:9s} {w:6.2f} s  peak RSS {m / (1 << 20):7.0f} MiB   time x{w / t_torch:.2f}, RSS x{m / rss_torch:.2f} "
              "of torch")


if __name__ == "__main__":
    main()
