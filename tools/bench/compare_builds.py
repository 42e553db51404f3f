"""Two builds of zckpt, one container, the same loads: is a change within noise of the code before it?

  python tools/bench/compare_builds.py --before OLD/build/tools/zckpt --after build/tools/zckpt \
      [--gib 1] [--rounds 9] [--modes load,into,map] [--no-verify]

Writes one ~1 GiB container with the --after build (a torch.save shard of transformer-shaped
bf16 and f32 tensors, converted), warms the page cache, then in each round runs `zckpt load
FILE --json` of every (build, mode) pair once, in an order shuffled afresh (seeded), each in a
fresh process, the load timed inside it (the JSON's `seconds`: process and torch start-up are
not load time). Prints per build and mode the median [min, max] seconds and the median of the
per-round ratios after / before; the machine's load average is printed beside them (a shared
machine is noisy: compare the ratio, not the seconds).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

MODE_FLAGS = {"load": [], "into": ["--into"], "map": ["--map"]}


def write_shard(zckpt, workdir, gib, python):
    pt = os.path.join(workdir, "shard.pt")
    out = os.path.join(workdir, "shard.zckpt")
    if not os.path.exists(out):
        code = (
            "import torch,sys\n"
            "g=torch.Generator().manual_seed(0)\n"
            "n=int(float(sys.argv[2])*(1<<30))//(2*4096*4096)\n"
            "sd={}\n"
            "for i in range(max(n,1)):\n"
            "  sd[f'layers.{i}.w']=torch.randn(4096,4096,generator=g).to(torch.bfloat16)\n"
            "  sd[f'layers.{i}.norm']=torch.randn(4096,generator=g)\n"
            "torch.save(sd,sys.argv[1])\n")
        subprocess.run([python, "-c", code, pt, str(gib)], check=True)
        subprocess.run([zckpt, "convert", pt, "-o", out, "--force"], check=True, stdout=subprocess.DEVNULL)
        os.remove(pt)
    return out


# Each build's binaries find their own libzckpt through their run path; LD_LIBRARY_PATH (which
# `meson devenv` sets to one build's folders) would win over it and give both the same library.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}


def load_once(zckpt, path, mode, verify):
    cmd = [zckpt, "load", path, "--json", "--progress", "never"] + MODE_FLAGS[mode] + ([] if verify else ["--no-verify"])
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, env=CLEAN_ENV)
    return json.loads(r.stdout.strip().splitlines()[-1])["seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--modes", default="load,into,map")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "zckpt-compare-builds"))
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    path = write_shard(a.after, a.workdir, a.gib, a.python)
    with open(path, "rb") as f:  # warm the page cache
        while f.read(16 << 20):
            pass
    modes = a.modes.split(",")
    builds = {"before": a.before, "after": a.after}
    runs = {(b, m): [] for b in builds for m in modes}
    rng = random.Random(a.seed)
    loads = []
    for _ in range(a.rounds):
        pairs = list(runs)
        rng.shuffle(pairs)
        loads.append(os.getloadavg()[0])
        for b, m in pairs:
            runs[(b, m)].append(load_once(builds[b], path, m, not a.no_verify))
    size = os.path.getsize(path)
    print(f"{size / (1 << 30):.2f} GiB container, {a.rounds} rounds, shuffled; verify {'off' if a.no_verify else 'on'}; "
          f"load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'mode':6} {'build':7} {'median s':>9} {'min':>7} {'max':>7}   after/before (median of rounds [min, max])")
    for m in modes:
        ratios = [x / y for x, y in zip(runs[("after", m)], runs[("before", m)])]
        for b in builds:
            s = runs[(b, m)]
            extra = ""
            if b == "after":
                extra = f"   {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"
            print(f"{m:6} {b:7} {statistics.median(s):9.3f} {min(s):7.3f} {max(s):7.3f}{extra}")


if __name__ == "__main__":
    main()
