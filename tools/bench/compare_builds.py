"""Two builds of zckpt, one container, the same loads: is a change within noise of the code before it?

  python tools/bench/compare_builds.py --before OLD/build/tools/zckpt --after build/tools/zckpt \
      [--gib 1] [--rounds 9] [--modes load,into,map] [--no-verify]
  ~/.cache/zckpt/venv/bin/python tools/bench/compare_builds.py --api python \
      --before OLD/build --after build [--modes import,load,map,map_noverify,into,save,convert]

Writes one ~1 GiB container with the --after build (a torch.save shard of transformer-shaped
bf16 and f32 tensors, converted; kept in --workdir, one per --gib), warms the page cache, then
in each round runs every (build, mode) pair once, in an order shuffled afresh (seeded), each in
a fresh process, the operation timed inside it (process and torch start-up are not load time).
Prints per build and mode the median [min, max] seconds and the median of the per-round ratios
after / before; the machine's load average is printed beside them (a shared machine is noisy:
compare the ratio, not the seconds).

--api cli (the default): --before/--after are zckpt tools; a run is `zckpt load FILE --json`
(the JSON's `seconds`), plain, --into or --map.

--api python: --before/--after are build folders; a run is `--python -c CODE` with the package
of that build importable as `meson devenv -C BUILD` makes it (PYTHONPATH=BUILD/src/python,
ZCKPT_CLI_DIR=BUILD/tools), torch and zckpt imported and the function looked up before the clock
starts. Modes:
  import        `import zckpt` alone (and whether it imported torch, printed under the table)
  load          zckpt.load(FILE, map_location="cpu")
  map           zckpt.load(FILE, mmap=True), then every storage byte read (max as uint8)
  map_noverify  the same with verify=False
  into          zckpt.load_into(FILE, state): state built untimed beforehand, the same tensors
                as zeros (pages faulted)
  iter          every tensor of zckpt.iter_tensors(FILE) (CPU), each reduced once (amax)
  save          zckpt.save(state, OUT) of the state zckpt.load returned (untimed)
  convert       zckpt.convert(PT, OUT) of the .pt the container was converted from
--no-verify passes verify=False to load, map, into and iter.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

MODE_FLAGS = {"load": [], "into": ["--into"], "map": ["--map"]}  # --api cli: `zckpt load` flags
PY_MODES = ["import", "load", "map", "map_noverify", "into", "iter", "save", "convert"]
DEFAULT_MODES = {"cli": "load,into,map", "python": ",".join(PY_MODES)}

SHARD_CODE = (
    "import torch,sys\n"
    "g=torch.Generator().manual_seed(0)\n"
    "n=int(float(sys.argv[2])*(1<<30))//(2*4096*4096)\n"
    "sd={}\n"
    "for i in range(max(n,1)):\n"
    "  sd[f'layers.{i}.w']=torch.randn(4096,4096,generator=g).to(torch.bfloat16)\n"
    "  sd[f'layers.{i}.norm']=torch.randn(4096,generator=g)\n"
    "torch.save(sd,sys.argv[1])\n")

# One --api python run: argv MODE FILE PT OUT VERIFY(0/1); prints {"seconds": ...} (import: and
# "torch", whether importing zckpt imported it). Everything but the operation happens before the
# clock starts, including the lookup of the zckpt function (which may import torch lazily).
PY_CODE = r'''
import json, sys, time
mode, path, pt, out, verify = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
if mode == "import":
    t = time.perf_counter()
    import zckpt
    print(json.dumps({"seconds": time.perf_counter() - t, "torch": "torch" in sys.modules}))
    sys.exit()
import torch
import zckpt


def read_all(state):  # every storage byte, once: amax over it as uint8 (a uint8 sum runs at ~0.2 GB/s)
    seen = set()
    for v in state.values():
        s = v.untyped_storage()
        if s.nbytes() and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            torch.empty(0, dtype=torch.uint8).set_(s).amax()
    return state


load, load_into, save, convert = zckpt.load, zckpt.load_into, zckpt.save, zckpt.convert
state = None
if mode == "into":
    state = {k: torch.zeros_like(v) for k, v in load(path, mmap=True, verify=False).items()}
elif mode == "save":
    state = load(path, map_location="cpu")
ops = {
    "load": lambda: load(path, map_location="cpu", verify=verify),
    "map": lambda: read_all(load(path, mmap=True, verify=verify)),
    "map_noverify": lambda: read_all(load(path, mmap=True, verify=False)),
    "into": lambda: load_into(path, state, verify=verify),
    "iter": lambda: [t.amax() for _, t in zckpt.iter_tensors(path, verify=verify)],
    "save": lambda: save(state, out),
    "convert": lambda: convert(pt, out),
}
t = time.perf_counter()
result = ops[mode]()  # kept: freeing what was loaded is not part of the time
print(json.dumps({"seconds": time.perf_counter() - t}))
'''


def write_shard(zckpt, workdir, gib, python, keep_pt):
    """(container, .pt) of about `gib` GiB in workdir, written once; the .pt only kept with keep_pt."""
    stem = os.path.join(workdir, f"shard-{gib:g}GiB")
    pt, out = stem + ".pt", stem + ".zckpt"
    if not os.path.exists(out) or (keep_pt and not os.path.exists(pt)):
        if not os.path.exists(pt):
            subprocess.run([python, "-c", SHARD_CODE, pt, str(gib)], check=True)
        if not os.path.exists(out):
            subprocess.run([zckpt, "convert", pt, "-o", out, "--force"], check=True, stdout=subprocess.DEVNULL)
        if not keep_pt:
            os.remove(pt)
    return out, pt


# Each build's binaries find their own libzckpt through their run path; LD_LIBRARY_PATH (which
# `meson devenv` sets to one build's folders) would win over it and give both the same library.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}


def load_once(zckpt, files, mode, a):
    cmd = [zckpt, "load", files["path"], "--json", "--progress", "never"] + MODE_FLAGS[mode] + (
        ["--no-verify"] if a.no_verify else [])
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, env=CLEAN_ENV)
    return json.loads(r.stdout.strip().splitlines()[-1])


def python_once(build, files, mode, a):
    # PYTHONPATH set, not prepended to: nothing else on it may supply another zckpt.
    build = os.path.abspath(build)
    env = dict(CLEAN_ENV, PYTHONPATH=os.path.join(build, "src", "python"), ZCKPT_CLI_DIR=os.path.join(build, "tools"))
    out = files["out"]
    cmd = [a.python, "-c", PY_CODE, mode, files["path"], files["pt"], out, "0" if a.no_verify else "1"]
    try:
        r = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    finally:
        if os.path.exists(out):
            os.remove(out)
    return json.loads(r.stdout.strip().splitlines()[-1])


RUN_ONCE = {"cli": load_once, "python": python_once}
KNOWN_MODES = {"cli": list(MODE_FLAGS), "python": PY_MODES}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="zckpt tool (--api cli) or build folder (--api python)")
    ap.add_argument("--after", required=True, help="the same for the build under test (it writes the container)")
    ap.add_argument("--api", choices=list(RUN_ONCE), default="cli")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--modes", help="comma-separated (default: " + "; ".join(f"{k}: {v}" for k, v in DEFAULT_MODES.items()) + ")")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "zckpt-compare-builds"))
    a = ap.parse_args()
    modes = (a.modes or DEFAULT_MODES[a.api]).split(",")
    unknown = [m for m in modes if m not in KNOWN_MODES[a.api]]
    if unknown:
        ap.error(f"--api {a.api}: unknown modes {unknown}; known: {','.join(KNOWN_MODES[a.api])}")
    os.makedirs(a.workdir, exist_ok=True)
    writer = a.after if a.api == "cli" else os.path.join(a.after, "tools", "zckpt")
    path, pt = write_shard(writer, a.workdir, a.gib, a.python, keep_pt="convert" in modes)
    files = {"path": path, "pt": pt, "out": os.path.join(a.workdir, "out.zckpt")}
    for f in [path] + ([pt] if "convert" in modes else []):  # warm the page cache
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass
    builds = {"before": a.before, "after": a.after}
    runs = {(b, m): [] for b in builds for m in modes}
    imports_torch = {}  # build -> whether `import zckpt` imported torch (import mode)
    rng = random.Random(a.seed)
    loads = []
    for _ in range(a.rounds):
        pairs = list(runs)
        rng.shuffle(pairs)
        loads.append(os.getloadavg()[0])
        for b, m in pairs:
            r = RUN_ONCE[a.api](builds[b], files, m, a)
            runs[(b, m)].append(r["seconds"])
            if "torch" in r:
                imports_torch[b] = r["torch"]
    size = os.path.getsize(path)
    via = f"; zckpt package through {a.python}" if a.api == "python" else ""
    print(f"{size / (1 << 30):.2f} GiB container, {a.rounds} rounds, shuffled; verify {'off' if a.no_verify else 'on'}; "
          f"load average {min(loads):.1f}-{max(loads):.1f}{via}")
    w = max(6, *map(len, modes))
    print(f"{'mode':{w}} {'build':7} {'median s':>9} {'min':>7} {'max':>7}   after/before (median of rounds [min, max])")
    for m in modes:
        ratios = [x / y for x, y in zip(runs[("after", m)], runs[("before", m)])]
        for b in builds:
            s = runs[(b, m)]
            extra = ""
            if b == "after":
                extra = f"   {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"
            print(f"{m:{w}} {b:7} {statistics.median(s):9.3f} {min(s):7.3f} {max(s):7.3f}{extra}")
    if imports_torch:
        print("import zckpt imports torch: " + ", ".join(f"{b} {'yes' if t else 'no'}" for b, t in imports_torch.items()))


if __name__ == "__main__":
    main()
