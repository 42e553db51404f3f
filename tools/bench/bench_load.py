"""Load benchmark: `zckpt load` against torch.load, safetensors and memcpy, in one run.

Makes a shard (~1 GiB by default: bf16 weights and f32 norms of realistic layer sizes) with
torch.save, the same weights as safetensors, converts the .pt with `zckpt convert`, then times,
each in a process of its own with the files in the page cache, best of --repeat:

  cpu   zckpt load (verified, unverified, in place), torch.load(map_location='cpu'),
        safetensors load_file (which maps the file lazily on CPU: also timed reading every
        page), a read of the file into fresh memory, a memcpy of as many bytes into fresh
        memory and into memory already faulted in, zckpt.load (the Python package);
        zckpt load --map vs torch.load(mmap=True)
  cuda  zckpt load --device cuda (and in place), zckpt.load(map_location='cuda'),
        torch.load(map_location='cuda'), safetensors
        load_file(device='cuda'), a pinned host-to-device copy of as many bytes

and prints seconds, GB/s, the ratio to zckpt load and the peak memory each took: host RSS
(VmHWM after, minus VmRSS before the load, both read by the process itself) and on cuda the
peak device bytes allocated. Usage:

  python tools/bench/bench_load.py --zckpt build/tools/zckpt [--device cpu|cuda] [--gib 1]
"""
import argparse
import json
import os
import subprocess
import sys
import time

GIB = 1 << 30


def host_memory():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def cpu_seconds():
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return u.ru_utime + u.ru_stime


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# ---------------------------------------------------------------- child side (one measurement)


def child(kind, path, nbytes):
    import torch

    cuda = kind.endswith("_cuda")
    if cuda:
        torch.zeros(1, device="cuda")  # CUDA context outside the timing
        torch.cuda.reset_peak_memory_stats()
        dev_before = torch.cuda.memory_allocated()
        reserved_before = torch.cuda.memory_reserved()
        free_before = torch.cuda.mem_get_info()[0]
    keep = []
    touch = kind.endswith("_touch")
    kind = kind[: -len("_touch")] if touch else kind
    if kind in ("memcpy", "memcpy_warm", "read"):
        import numpy as np

        src = np.ones(nbytes, np.uint8) if kind.startswith("memcpy") else None
        if kind == "memcpy_warm":  # destination already faulted in: the copy alone
            dst = torch.empty(nbytes, dtype=torch.uint8).numpy()
            dst.fill(0)
    if kind.startswith("zckpt_py"):
        import zckpt
    if kind == "pinned_cuda":
        src = torch.ones(nbytes, dtype=torch.uint8).pin_memory()
    reset_peak()
    before = host_memory()["VmRSS"]
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    if kind == "torch":
        keep.append(torch.load(path, map_location="cpu", weights_only=True))
    elif kind == "torch_mmap":
        keep.append(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
    elif kind == "torch_cuda":
        keep.append(torch.load(path, map_location="cuda", weights_only=True))
    elif kind == "safetensors":
        from safetensors.torch import load_file

        keep.append(load_file(path, device="cpu"))
    elif kind == "safetensors_cuda":
        from safetensors.torch import load_file

        keep.append(load_file(path, device="cuda"))
    elif kind == "memcpy":
        # torch.empty, not np.empty: numpy madvises large arrays MADV_HUGEPAGE, which made first
        # touch 2-3x slower here (THP compaction); loaders' destinations are torch allocations.
        dst = torch.empty(nbytes, dtype=torch.uint8).numpy()
        np.copyto(dst, src)
        keep.append(dst)
    elif kind == "memcpy_warm":
        np.copyto(dst, src)
        keep.append(dst)
    elif kind == "zckpt_py":
        keep.append(zckpt.load(path, map_location="cpu"))
    elif kind == "zckpt_py_cuda":
        keep.append(zckpt.load(path, map_location="cuda"))
    elif kind == "read":
        dst = torch.empty(os.path.getsize(path), dtype=torch.uint8).numpy()
        with open(path, "rb", buffering=0) as f:
            f.readinto(memoryview(dst))
        keep.append(dst)
    elif kind == "pinned_cuda":
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst.copy_(src, non_blocking=True)
        keep.append(dst)
    if touch:  # lazily mapped results: read a byte of every page so the data is really there
        for t in keep[0].values():
            if t.numel():
                t.contiguous().view(-1).view(torch.uint8)[::4096].sum()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "cpu_seconds": cpu_seconds() - cpu0, "rss_before": before,
           "rss_peak": host_memory()["VmHWM"]}
    if cuda:  # read while `keep` (the result) is alive
        out["device_peak"] = torch.cuda.max_memory_allocated() - dev_before
        out["device_reserved_peak"] = torch.cuda.max_memory_reserved() - reserved_before
        out["device_used"] = free_before - torch.cuda.mem_get_info()[0]
    print(json.dumps(out))


# ---------------------------------------------------------------- parent side


def make_files(workdir, gib):
    import torch
    from safetensors.torch import save_file

    pt, st = os.path.join(workdir, "shard.pt"), os.path.join(workdir, "shard.safetensors")
    if os.path.exists(pt) and os.path.exists(st):
        return pt, st
    torch.manual_seed(0)
    hidden, inter = 2048, 5632  # a 1B-class decoder layer: ~98 MiB in bf16
    sd = {"embed_tokens.weight": torch.randn(32000, hidden, dtype=torch.bfloat16)}
    layer = 0
    while sum(t.numel() * t.element_size() for t in sd.values()) < gib * GIB:
        p = f"layers.{layer}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + "self_attn." + name + ".weight"] = torch.randn(hidden, hidden, dtype=torch.bfloat16)
        for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
            sd[p + "mlp." + name + ".weight"] = torch.randn(*shape, dtype=torch.bfloat16)
        sd[p + "input_layernorm.weight"] = torch.ones(hidden, dtype=torch.float32)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.float32)
        layer += 1
    sd["norm.weight"] = torch.ones(hidden, dtype=torch.float32)
    torch.save(sd, pt)
    save_file(sd, st)
    return pt, st


PY_PACKAGE = None  # BUILD/src/python, holding the built `zckpt` package (set from --zckpt)


def run_child(kind, path, nbytes):
    env = dict(os.environ)
    if PY_PACKAGE:
        env["PYTHONPATH"] = PY_PACKAGE + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--child", kind, path, str(nbytes)],
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_zckpt(zckpt, path, args):
    out = subprocess.run([zckpt, "load", path, "--json", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"zckpt load {' '.join(args)} failed ({out.returncode}): {out.stdout}{out.stderr}")
    d = json.loads(out.stdout)
    r = {"seconds": d["seconds"], "cpu_seconds": d["cpu_seconds"], "rss_before": d["rss_before"],
         "rss_peak": d["rss_peak"]}
    if "device_peak_bytes" in d:
        r["device_peak"] = d["device_peak_bytes"]
        r["device_reserved_peak"] = d["device_peak_reserved_delta"]
        r["device_used"] = d["device_used_delta"]
    return r


def best(repeat, fn):
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r["seconds"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--zckpt", default="build/tools/zckpt")
    ap.add_argument("--workdir", default="/tmp/zckpt-bench-load")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="zckpt reader threads (0: its default)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    ap.add_argument("--out", help="also write the rows (and the run's settings) as JSON to this file")
    args = ap.parse_args()
    global PY_PACKAGE
    PY_PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.zckpt))), "src", "python")
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]))

    os.makedirs(args.workdir, exist_ok=True)
    pt, st = make_files(args.workdir, args.gib)
    zc = os.path.join(args.workdir, "shard.zckpt")
    if not os.path.exists(zc):
        subprocess.run([args.zckpt, "convert", pt, "-o", zc], check=True, capture_output=True)
    nbytes = os.path.getsize(st)  # about the tensor bytes (the header is small)
    for p in (pt, st, zc):  # page cache warm for everyone
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass
    extra = ["--threads", str(args.threads)] if args.threads else []
    rows = []

    def add(name, fn, group="load"):
        r = best(args.repeat, fn)
        r["name"], r["bytes"], r["group"] = name, nbytes, group
        rows.append(r)
        print(f"  measured {name}: {r['seconds']:.3f} s", file=sys.stderr, flush=True)

    if args.device == "cpu":
        add("zckpt load (verified)", lambda: run_zckpt(args.zckpt, zc, extra))
        add("zckpt load --no-verify", lambda: run_zckpt(args.zckpt, zc, extra + ["--no-verify"]))
        add("zckpt load --into (in place)", lambda: run_zckpt(args.zckpt, zc, extra + ["--into"]))
        add("zckpt.load (Python) map_location=cpu", lambda: run_child("zckpt_py", zc, nbytes))
        add("torch.load map_location=cpu", lambda: run_child("torch", pt, nbytes))
        add("safetensors load_file (lazy mmap)", lambda: run_child("safetensors", st, nbytes))
        add("safetensors load_file + read pages", lambda: run_child("safetensors_touch", st, nbytes))
        add("read(2) file into fresh memory", lambda: run_child("read", zc, nbytes))
        add("memcpy into fresh memory", lambda: run_child("memcpy", zc, nbytes))
        add("memcpy into warm memory", lambda: run_child("memcpy_warm", zc, nbytes))
        add("zckpt load --map", lambda: run_zckpt(args.zckpt, zc, ["--map"]), "map")
        add("torch.load mmap=True", lambda: run_child("torch_mmap", pt, nbytes), "map")
        add("torch.load mmap=True + read pages", lambda: run_child("torch_mmap_touch", pt, nbytes), "map")
    else:
        add("zckpt load --device cuda", lambda: run_zckpt(args.zckpt, zc, extra + ["--device", "cuda"]))
        add("zckpt load --device cuda --no-verify", lambda: run_zckpt(args.zckpt, zc, extra + ["--device", "cuda", "--no-verify"]))
        add("zckpt load --device cuda --into", lambda: run_zckpt(args.zckpt, zc, extra + ["--device", "cuda", "--into"]))
        add("zckpt.load (Python) map_location=cuda", lambda: run_child("zckpt_py_cuda", zc, nbytes))
        add("torch.load map_location=cuda", lambda: run_child("torch_cuda", pt, nbytes))
        add("safetensors load_file cuda", lambda: run_child("safetensors_cuda", st, nbytes))
        add("pinned cudaMemcpy (H2D)", lambda: run_child("pinned_cuda", zc, nbytes))

    ref = {}
    for r in rows:
        ref.setdefault(r["group"], r["seconds"])
    print(f"\n{nbytes / GIB:.2f} GiB of tensors, device {args.device}, best of {args.repeat}, page cache warm\n")
    head = f"{'':38} {'seconds':>8} {'GB/s':>7} {'x zckpt':>8} {'CPU s':>7} {'RSS peak +':>11}"
    if args.device == "cuda":
        head += f" {'dev peak':>10} {'reserved':>10} {'dev used':>10}"
    print(head)
    for r in rows:
        gbps = r["bytes"] / r["seconds"] / 1e9
        delta = (r["rss_peak"] - r["rss_before"]) / 2**20
        line = f"{r['name']:38} {r['seconds']:8.3f} {gbps:7.2f} {r['seconds'] / ref[r['group']]:8.2f} {r['cpu_seconds']:7.3f} {delta:9.0f} MiB"
        if args.device == "cuda":
            for key in ("device_peak", "device_reserved_peak", "device_used"):
                line += f" {r.get(key, 0) / 2**20:7.0f} MiB"
        print(line)
    print("\nx zckpt: seconds relative to zckpt's row of the group (load; map), above 1: slower.")
    print("CPU s: user+system seconds of all the process's threads during the load (on a shared,")
    print("  oversubscribed machine less noisy than wall time).")
    print("RSS peak +: VmHWM after the load minus VmRSS before it, read by the process itself.")
    if args.device == "cuda":
        print("dev peak: torch's peak allocated bytes over those before; reserved: the caching allocator's peak")
        print("  segments over those before (what decides success on a nearly full card); dev used: how much")
        print("  less cudaMemGetInfo reports free with the result alive.")
    if args.json:
        print(json.dumps(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": args.device, "gib": args.gib, "repeat": args.repeat, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
