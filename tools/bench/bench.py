"""The load benchmark: zckpt against its peers and against floors, in a way a skeptic accepts.

  python tools/bench/bench.py --zckpt build/tools/zckpt [--rounds 10] [--gib 1] [--modes warm,cold]

How it measures:
- One ~1 GiB transformer-shaped shard (bf16 weights, f32 norms), written by torch.save, then as
  safetensors, a tensorizer file and a .zckpt (`zckpt convert`); every contender loads the same
  tensors, and after its timed load each returns a digest of them (name, dtype, shape, bytes)
  that must equal the digest of the tensors torch.save wrote (checked in every round).
- N rounds; in each, every (contender, cache mode) pair runs once, in an order shuffled afresh
  (seeded: --seed), each in a fresh process timed from inside (contenders.py): interpreter and
  library start-up are not load time. Results: min / median / max per contender, and paired
  ratios: contender / reference within the same round and mode, whose median [min, max] is less
  sensitive to a noisy moment than a ratio of medians (both are printed).
- warm: the file read whole just before the load (mincore says 100% resident); cold: the file's
  pages evicted just before the load (--cold fadvise: posix_fadvise(DONTNEED) of that file, the
  default; --cold drop: `echo 3 > /proc/sys/vm/drop_caches`, root only, every clean page of the
  machine), after the process's imports, and mincore must then say ~0% resident.
- Floors: `dd iflag=direct bs=16M` (the device's sequential read speed, cold rows), read(2)
  into fresh memory from one thread, and pread into fresh memory with zckpt's own tricks
  (MADV_POPULATE_WRITE first, as many threads as zckpt's default readers).
- Machine load: /proc/loadavg before and after every run and the machine's CPU busy fraction
  during it (/proc/stat): the machine is shared, so every figure comes with what else ran.

Peers that are not installed (tensorizer, fastsafetensors, Run:ai streamer:
tools/bench/setup-peers.sh puts them in a virtualenv of their own) are skipped and said so.
--out FILE keeps every run as JSON.
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import contenders  # noqa: E402  (the child side; here for its page-cache helpers)

GIB = 1 << 30
REFERENCE = "zckpt_py"

# name -> (label, file kind, how it runs). Python contenders run contenders.py KIND in the
# project's virtualenv ('project') or the peers' ('peers'); 'cli' rows are commands.
CONTENDERS = {
    "zckpt_py": ("zckpt.load (verified)", "zckpt", "project"),
    "zckpt_py_noverify": ("zckpt.load verify=False", "zckpt", "project"),
    "zckpt_cli": ("zckpt load CLI (verified)", "zckpt", "cli"),
    "zckpt_into": ("zckpt load --into (in place)", "zckpt", "cli"),
    "zckpt_mmap": ("zckpt.load mmap=True + read all", "zckpt", "project"),
    "zckpt_cli_buffered": ("zckpt load CLI --buffered", "zckpt", "cli"),
    "zckpt_cli_ring": ("zckpt load CLI --ring-only", "zckpt", "cli"),
    "zckpt_cli_mmap": ("zckpt load CLI --method mmap", "zckpt", "cli"),
    "zckpt_cli_direct": ("zckpt load CLI --method direct", "zckpt", "cli"),
    "zckpt_cli_map": ("zckpt load CLI --map (verified)", "zckpt", "cli"),
    "torch": ("torch.load", "pt", "project"),
    "torch_mmap": ("torch.load mmap=True + read all", "pt", "project"),
    "safetensors": ("safetensors load_file + read all", "safetensors", "project"),
    "tensorizer": ("tensorizer", "tensors", "peers"),
    "tensorizer_verified": ("tensorizer verify_hash=True", "tensors", "peers"),
    "fastsafetensors": ("fastsafetensors (nogds)", "safetensors", "peers"),
    "runai": ("Run:ai SafetensorsStreamer", "safetensors", "peers"),
    "floor_dd_direct": ("floor: dd iflag=direct bs=16M", "zckpt", "cli"),
    "floor_read_1t": ("floor: read(2), 1 thread", "zckpt", "project"),
    "floor_pread_tricks": ("floor: pread+populate, N threads", "zckpt", "project"),
    # In place (a resume): destination tensors zeroed before the clock starts, then filled.
    "zckpt_into_py": ("zckpt.load_into (in place, verified)", "zckpt", "project"),
    "zckpt_into_py_noverify": ("zckpt.load_into verify=False", "zckpt", "project"),
    "safetensors_into": ("safetensors safe_open + copy_ (in place)", "safetensors", "project"),
    "zckpt_mmap_noverify": ("zckpt.load mmap=True verify=False + read all", "zckpt", "project"),
    "floor_pread_faulted": ("floor: pread into faulted memory, N threads", "zckpt", "project"),
    "floor_memcpy_faulted": ("floor: memcpy from a mapping into faulted memory, N threads", "zckpt", "project"),
}
# --device cuda: loads onto the first GPU (reference zckpt_py_cuda).
CUDA_CONTENDERS = {
    "zckpt_py_cuda": ("zckpt.load cuda (verified)", "zckpt", "project"),
    "zckpt_py_cuda_noverify": ("zckpt.load cuda verify=False (the checksum's cost)", "zckpt", "project"),
    "zckpt_cli_cuda": ("zckpt load CLI --device cuda", "zckpt", "cli"),
    "zckpt_into_cuda": ("zckpt load --device cuda --into", "zckpt", "cli"),
    "torch_cuda": ("torch.load cuda", "pt", "project"),
    "safetensors_cuda": ("safetensors load_file cuda", "safetensors", "project"),
    "fastsafetensors_cuda": ("fastsafetensors cuda (nogds)", "safetensors", "peers"),
    "floor_pinned_h2d": ("floor: pinned H2D copy", "zckpt", "project"),
}
CONTENDERS.update(CUDA_CONTENDERS)
# zckpt load's read-path variants: only when asked for with --only (the default run compares
# zckpt with its peers and floors).
VARIANTS = ("zckpt_cli_buffered", "zckpt_cli_ring", "zckpt_cli_mmap", "zckpt_cli_direct", "zckpt_cli_map")
# zckpt load's arguments per CLI contender (besides FILE --json).
CLI_ARGS = {"zckpt_into": ["--into"], "zckpt_cli_buffered": ["--buffered"], "zckpt_cli_ring": ["--ring-only"],
            "zckpt_cli_mmap": ["--method", "mmap"], "zckpt_cli_direct": ["--method", "direct"], "zckpt_cli_map": ["--map"]}
PEERS = ("torch", "torch_mmap", "safetensors", "tensorizer", "tensorizer_verified", "fastsafetensors", "runai")


# ---------------------------------------------------------------- the files


def make_files(workdir, gib, zckpt, peers_python):
    """shard.{pt,safetensors,zckpt,tensors} and expected.json (the tensors' digest)."""
    paths = {k: os.path.join(workdir, "shard." + ext) for k, ext in
             (("pt", "pt"), ("safetensors", "safetensors"), ("zckpt", "zckpt"), ("tensors", "tensors"))}
    expected = os.path.join(workdir, "expected.json")
    if not (os.path.exists(paths["pt"]) and os.path.exists(expected)):
        import torch
        from safetensors.torch import save_file

        torch.manual_seed(0)
        hidden, inter = 2048, 5632  # a 1B-class decoder layer: ~98 MiB in bf16
        sd = {"embed_tokens.weight": torch.randn(32000, hidden, dtype=torch.bfloat16)}
        layer = 0
        while sum(t.numel() * t.element_size() for t in sd.values()) < gib * GIB:
            p = f"layers.{layer}."
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                sd[p + "self_attn." + name + ".weight"] = torch.randn(hidden, hidden, dtype=torch.bfloat16)
            for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                ("down_proj", (hidden, inter))):
                sd[p + "mlp." + name + ".weight"] = torch.randn(*shape, dtype=torch.bfloat16)
            sd[p + "input_layernorm.weight"] = torch.rand(hidden, dtype=torch.float32)
            sd[p + "post_attention_layernorm.weight"] = torch.rand(hidden, dtype=torch.float32)
            layer += 1
        sd["norm.weight"] = torch.rand(hidden, dtype=torch.float32)
        torch.save(sd, paths["pt"])
        save_file(sd, paths["safetensors"])
        with open(expected, "w") as f:
            json.dump({"digest": contenders.digest(sd), "tensor_bytes": sum(t.numel() * t.element_size() for t in sd.values()),
                       "tensors": len(sd)}, f)
        for k in ("zckpt", "tensors"):
            if os.path.exists(paths[k]):
                os.unlink(paths[k])
    if not os.path.exists(paths["zckpt"]):
        subprocess.run([zckpt, "convert", paths["pt"], "-o", paths["zckpt"]], check=True, capture_output=True)
    if peers_python and not os.path.exists(paths["tensors"]):
        script = ("import sys; from safetensors.torch import load_file; from tensorizer import TensorSerializer\n"
                  "s = TensorSerializer(sys.argv[2]); s.write_state_dict(load_file(sys.argv[1])); s.close()\n")
        subprocess.run([peers_python, "-c", script, paths["safetensors"], paths["tensors"]], check=True)
    os.sync()  # nothing dirty left: eviction must be able to drop every page
    with open(expected) as f:
        return paths, json.load(f)


# ---------------------------------------------------------------- the machine


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v), idle


def busy_fraction(t0, t1):
    total, idle = t1[0] - t0[0], t1[1] - t0[1]
    return (total - idle) / total if total > 0 else 0.0


def drop_caches_works():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- one run


class Runner:
    def __init__(self, args, paths):
        self.args, self.paths = args, paths
        build = os.path.dirname(os.path.dirname(os.path.abspath(args.zckpt)))
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.path.join(build, "src", "python") + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env.setdefault("RUNAI_STREAMER_LOG_LEVEL", "WARNING")

    def python_for(self, where):
        return self.args.peers_python if where == "peers" else self.args.python

    def run(self, name, mode):
        label, kind, where = CONTENDERS[name]
        path = self.paths[kind]
        cache = "warm" if mode == "warm" else self.args.cold
        r = {"contender": name, "mode": mode}
        r["load_before"], ticks0 = loadavg(), cpu_ticks()
        wall0 = time.perf_counter()
        if where == "cli":
            r.update(self.run_cli(name, path, cache))
        else:
            cmd = [self.python_for(where), os.path.join(HERE, "contenders.py"), name, path, "--cache", cache, "--digest"]
            out = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
            if out.returncode != 0:
                raise RuntimeError(f"{name} ({mode}) failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-4000:]}")
            r.update(json.loads(out.stdout.strip().splitlines()[-1]))
        r["process_seconds"] = time.perf_counter() - wall0
        r["load_after"], r["machine_busy"] = loadavg(), busy_fraction(ticks0, cpu_ticks())
        return r

    def run_cli(self, name, path, cache):
        resident = contenders.prepare_cache(path, cache)
        if name == "floor_dd_direct":
            ru0 = os.times()
            out = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"],
                                 capture_output=True, text=True)
            ru1 = os.times()
            if out.returncode != 0:
                raise RuntimeError(f"dd failed: {out.stderr}")
            m = re.search(r"copied, ([0-9.]+) s", out.stderr)
            return {"seconds": float(m.group(1)), "resident_before": resident,
                    "cpu_seconds": (ru1.children_user - ru0.children_user) + (ru1.children_system - ru0.children_system)}
        extra = list(CLI_ARGS.get(name.removesuffix("_cuda"), []))
        if name.endswith("_cuda"):
            extra += ["--device", "cuda"]
        out = subprocess.run([self.args.zckpt, "load", path, "--json", *extra], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"zckpt load {' '.join(extra)} failed ({out.returncode}): {out.stdout}{out.stderr}")
        d = json.loads(out.stdout)
        # The CLI checks every chunk's XXH3 against the index (written from the same bytes the
        # digest covers): a load that returns is a load of the written bytes.
        r = {"seconds": d["seconds"], "cpu_seconds": d["cpu_seconds"], "rss_before": d["rss_before"],
             "uncached_bytes": d.get("uncached_bytes"),
             "rss_peak": d["rss_peak"], "resident_before": resident, "digest": "checked by XXH3" if d.get("verified") else None}
        if "device_peak_bytes" in d:
            r["device_peak"] = d["device_peak_bytes"]
            r["device_reserved_peak"] = d["device_peak_reserved_delta"]
            r["device_used"] = d["device_used_delta"]
        return r


# ---------------------------------------------------------------- report


def summarize(runs, expected, names, modes, reference):
    rows = []
    for mode in modes:
        ref_by_round = {r["round"]: r["seconds"] for r in runs if r["mode"] == mode and r["contender"] == reference}
        for name in names:
            rs = [r for r in runs if r["mode"] == mode and r["contender"] == name]
            if not rs:
                continue
            secs = sorted(r["seconds"] for r in rs)
            ratios = sorted(r["seconds"] / ref_by_round[r["round"]] for r in rs if r["round"] in ref_by_round)
            digests = {r.get("digest") for r in rs if "digest" in r}
            bad_digest = [d for d in digests if d not in (expected["digest"], "checked by XXH3")]
            resid = [r.get("resident_before", -1) for r in rs]
            cache_ok = all(x >= 0.99 for x in resid) if mode == "warm" else all(0 <= x <= 0.01 for x in resid)
            rss = [r["rss_peak"] - r["rss_before"] for r in rs if "rss_peak" in r]
            dev = {k: [r[k] for r in rs if k in r] for k in ("device_peak", "device_reserved_peak", "device_used")}
            rows.append({
                "contender": name, "label": CONTENDERS[name][0], "mode": mode, "n": len(rs),
                "min": secs[0], "median": statistics.median(secs), "max": secs[-1],
                "cpu_median": statistics.median(r["cpu_seconds"] for r in rs),
                "rss_peak_delta_median": statistics.median(rss) if rss else None,
                # CUDA: torch's peak allocated bytes over those before; the caching allocator's peak
                # reserved (what decides success on a nearly full card); how much less free memory
                # cudaMemGetInfo reports with the result alive.
                **{k + "_median": statistics.median(v) if v else None for k, v in dev.items()},
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": ratios[0] if ratios else None, "ratio_max": ratios[-1] if ratios else None,
                "identical": None if not digests or digests == {None} else not bad_digest,
                "cache_ok": cache_ok, "resident_min": min(resid), "resident_max": max(resid),
            })
    return rows


def print_table(rows, runs, expected, args, drop_ok, reference):
    gb = expected["tensor_bytes"] / 1e9
    print(f"\n{expected['tensor_bytes'] / GIB:.2f} GiB of tensors ({expected['tensors']}), {args.rounds} rounds, "
          f"fresh process per run, order shuffled per round (seed {args.seed}); cold = {args.cold}"
          f"{' (drop_caches also works here)' if drop_ok and args.cold != 'drop' else ''}")
    for mode in sorted({r["mode"] for r in rows}, key=["warm", "cold"].index):
        ref = next((r for r in rows if r["mode"] == mode and r["contender"] == reference), None)
        print(f"\n[{mode}]  seconds: min / median / max;  x ref: this / {reference} in the same round, "
              f"median [min, max];  ratio of medians")
        print(f"  {'contender':36} {'min':>6} {'median':>7} {'max':>6} {'GB/s':>6}  {'x ref (paired)':>20} "
              f"{'med/med':>7} {'CPU s':>6} {'RSS+MiB':>7} {'same':>4}")
        for r in (x for x in rows if x["mode"] == mode):
            paired = (f"{r['ratio_median']:.2f} [{r['ratio_min']:.2f},{r['ratio_max']:.2f}]"
                      if r["ratio_median"] is not None else "-")
            mm = f"{r['median'] / ref['median']:.2f}" if ref else "-"
            same = {True: "yes", False: "NO", None: "-"}[r["identical"]]
            rss = f"{r['rss_peak_delta_median'] / 2**20:7.0f}" if r["rss_peak_delta_median"] is not None else "      -"
            if r["device_peak_median"] is not None:
                rss += f" dev+{r['device_peak_median'] / 2**20:.0f}MiB"
            flag = "" if r["cache_ok"] else f"  (resident {r['resident_min']:.2f}-{r['resident_max']:.2f}!)"
            print(f"  {r['label']:36} {r['min']:6.3f} {r['median']:7.3f} {r['max']:6.3f} {gb / r['median']:6.2f}  "
                  f"{paired:>20} {mm:>7} {r['cpu_median']:6.2f} {rss} {same:>4}{flag}")
    la = [r["load_before"] for r in runs] + [r["load_after"] for r in runs]
    busy = [r["machine_busy"] for r in runs]
    print(f"\nmachine: {os.cpu_count()} CPUs; loadavg(1 min) over the runs min {min(la):.2f} / median "
          f"{statistics.median(la):.2f} / max {max(la):.2f}; CPU busy during runs (all processes, this "
          f"benchmark's included) median {statistics.median(busy) * 100:.0f}% (max {max(busy) * 100:.0f}%)")
    print("same: the tensors' digest equals that of the tensors torch.save wrote (zckpt CLI rows: every "
          "chunk's XXH3 checked); RSS+: VmHWM after minus VmRSS before, read in the process.")


def report_targets(tg):
    if tg:
        print("\ntargets (issues 18, 36): met only if met by the medians and by the paired ratio")
        for what, ok, detail in tg:
            print(f"  [{'met' if ok else 'NOT met'}] {what}: {detail}")


def paired(runs, a, b, mode, key="seconds"):
    """Median [min, max] over rounds of a's figure / b's figure in the same round and mode."""
    A = {r["round"]: r[key] for r in runs if r["contender"] == a and r["mode"] == mode}
    B = {r["round"]: r[key] for r in runs if r["contender"] == b and r["mode"] == mode}
    v = sorted(A[k] / B[k] for k in A if k in B and B[k] > 0)
    return (statistics.median(v), v[0], v[-1]) if v else None


def targets(rows, runs):
    """The issue's targets, met or not: by the ratio of medians and, where they disagree, by the
    paired ratio (round by round) as well; both are printed."""
    def get(name, mode):
        return next((r for r in rows if r["contender"] == name and r["mode"] == mode), None)

    def vs(a, b, mode, key="seconds"):
        p = paired(runs, a, b, mode, key)
        return f"paired {p[0]:.2f}x [{p[1]:.2f}, {p[2]:.2f}]" if p else "no paired rounds"

    out = []
    cold_ref, cold_dd = get(REFERENCE, "cold"), get("floor_dd_direct", "cold")
    peers_cold = [get(p, "cold") for p in PEERS if get(p, "cold")]
    if cold_ref and peers_cold:
        best = min(peers_cold, key=lambda r: r["median"])
        p = paired(runs, REFERENCE, best["contender"], "cold")
        out.append(("cold verified load <= fastest peer's cold time",
                    cold_ref["median"] <= best["median"] and (p is None or p[0] <= 1.0),
                    f"{cold_ref['median']:.3f} s vs {best['label']} {best['median']:.3f} s "
                    f"({vs(REFERENCE, best['contender'], 'cold')})"))
    if cold_ref and cold_dd:
        p = paired(runs, REFERENCE, "floor_dd_direct", "cold")
        out.append(("cold verified load <= 1.15x dd iflag=direct",
                    cold_ref["median"] <= 1.15 * cold_dd["median"] and (p is None or p[0] <= 1.15),
                    f"{cold_ref['median']:.3f} s vs dd {cold_dd['median']:.3f} s = "
                    f"{cold_ref['median'] / cold_dd['median']:.2f}x ({vs(REFERENCE, 'floor_dd_direct', 'cold')})"))
    for mode in ("warm", "cold"):
        z, t = get(REFERENCE, mode), get("torch", mode)
        if z and t:
            p = paired(runs, REFERENCE, "torch", mode, "cpu_seconds")
            out.append((f"verified load CPU-s <= torch.load's ({mode})",
                        z["cpu_median"] <= t["cpu_median"] and (p is None or p[0] <= 1.0),
                        f"{z['cpu_median']:.2f} vs {t['cpu_median']:.2f} CPU-s "
                        f"({vs(REFERENCE, 'torch', mode, 'cpu_seconds')})"))
    for mode in ("warm", "cold"):
        z, s = get("zckpt_mmap", mode), get("safetensors", mode)
        if z and s:
            p = paired(runs, "zckpt_mmap", "safetensors", mode)
            out.append((f"verified mmap load + read all <= 1.2x safetensors' ({mode})",
                        z["median"] <= 1.2 * s["median"] and (p is None or p[0] <= 1.2),
                        f"{z['median']:.3f} vs {s['median']:.3f} s = {z['median'] / s['median']:.2f}x "
                        f"({vs('zckpt_mmap', 'safetensors', mode)})"))
    # Verified at the speed of a copy (issue 36), warm: the in-place load against the faster
    # in-place floor and safetensors' in-place copy; the verified mapping against the unverified.
    floors = [get(f, "warm") for f in ("floor_pread_faulted", "floor_memcpy_faulted") if get(f, "warm")]
    into, st_into = get("zckpt_into_py", "warm"), get("safetensors_into", "warm")
    if into and floors:
        floor = min(floors, key=lambda r: r["median"])
        p = paired(runs, "zckpt_into_py", floor["contender"], "warm")
        out.append(("verified in-place load <= 1.15x the faulted-memory copy floor (warm)",
                    into["median"] <= 1.15 * floor["median"] and (p is None or p[0] <= 1.15),
                    f"{into['median']:.3f} vs {floor['label']} {floor['median']:.3f} s = "
                    f"{into['median'] / floor['median']:.2f}x ({vs('zckpt_into_py', floor['contender'], 'warm')})"))
    if into and st_into:
        p = paired(runs, "zckpt_into_py", "safetensors_into", "warm")
        out.append(("verified in-place load <= safetensors safe_open + copy_ (warm)",
                    into["median"] <= st_into["median"] and (p is None or p[0] <= 1.0),
                    f"{into['median']:.3f} vs {st_into['median']:.3f} s ({vs('zckpt_into_py', 'safetensors_into', 'warm')})"))
    z, zn = get("zckpt_mmap", "warm"), get("zckpt_mmap_noverify", "warm")
    if z and zn:
        p = paired(runs, "zckpt_mmap", "zckpt_mmap_noverify", "warm")
        out.append(("verified mmap load + read all <= 1.2x the same with verify=False (warm)",
                    z["median"] <= 1.2 * zn["median"] and (p is None or p[0] <= 1.2),
                    f"{z['median']:.3f} vs {zn['median']:.3f} s = {z['median'] / zn['median']:.2f}x "
                    f"({vs('zckpt_mmap', 'zckpt_mmap_noverify', 'warm')})"))
    return out


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zckpt", default="build/tools/zckpt")
    ap.add_argument("--python", default=sys.executable, help="the project's Python (torch, safetensors, zckpt)")
    ap.add_argument("--peers-python", default=os.path.expanduser("~/.cache/zckpt/peers-venv/bin/python"),
                    help="a Python that also has tensorizer, fastsafetensors, runai-model-streamer "
                         "(tools/bench/setup-peers.sh); peers are skipped when it is missing")
    ap.add_argument("--workdir", default="/tmp/zckpt-bench")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cold", default="fadvise", choices=["fadvise", "drop"])
    ap.add_argument("--only", help="comma-separated contenders (default: every available one but the zckpt_cli_* "
                                   "read-path variants)")
    ap.add_argument("--wait-load", type=float, default=0,
                    help="before starting, wait (up to --wait-max s) until the 1-minute loadavg is below this")
    ap.add_argument("--wait-max", type=float, default=600)
    ap.add_argument("--out", help="write every run and the summary as JSON here")
    ap.add_argument("--report", help="print the tables and targets of a run saved with --out, running nothing")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        settings = argparse.Namespace(**saved["settings"])
        reference = "zckpt_py_cuda" if getattr(settings, "device", "cpu") == "cuda" else REFERENCE
        print_table(saved["rows"], saved["runs"], saved["expected"], settings, saved.get("drop_caches_works"), reference)
        report_targets(targets(saved["rows"], saved["runs"]) if reference == REFERENCE else [])
        return 0

    modes = [m for m in args.modes.split(",") if m]
    drop_ok = drop_caches_works()
    if args.cold == "drop" and not drop_ok:
        raise SystemExit("bench: --cold drop needs write access to /proc/sys/vm/drop_caches (root); use --cold fadvise")
    if not os.path.exists(args.peers_python):
        print(f"bench: no peers Python at {args.peers_python}: tensorizer, fastsafetensors and Run:ai are skipped "
              "(tools/bench/setup-peers.sh installs them)", file=sys.stderr)
        args.peers_python = None
    pool = [n for n in CONTENDERS if (n in CUDA_CONTENDERS) == (args.device == "cuda") and n not in VARIANTS]
    reference = "zckpt_py_cuda" if args.device == "cuda" else REFERENCE
    names = [n for n in (args.only.split(",") if args.only else pool)]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        raise SystemExit(f"bench: unknown contenders {unknown}; known: {', '.join(CONTENDERS)}")
    if not args.peers_python:
        names = [n for n in names if CONTENDERS[n][2] != "peers"]
    if reference not in names:
        names.insert(0, reference)

    os.makedirs(args.workdir, exist_ok=True)
    paths, expected = make_files(args.workdir, args.gib, args.zckpt, args.peers_python)
    if args.wait_load:
        t0 = time.time()
        while loadavg() >= args.wait_load and time.time() - t0 < args.wait_max:
            time.sleep(10)
        print(f"bench: loadavg {loadavg():.2f} after waiting {time.time() - t0:.0f} s", file=sys.stderr)

    runner = Runner(args, paths)
    rng = random.Random(args.seed)
    runs = []
    started = time.time()
    for rnd in range(args.rounds):
        # dd iflag=direct reads the device whatever the cache holds: a cold-only floor.
        order = [(n, m) for n in names for m in modes if not (n == "floor_dd_direct" and m == "warm")]
        rng.shuffle(order)
        for name, mode in order:
            r = runner.run(name, mode)
            r["round"] = rnd
            runs.append(r)
        print(f"  round {rnd + 1}/{args.rounds} done ({time.time() - started:.0f} s, loadavg {loadavg():.2f})",
              file=sys.stderr, flush=True)

    rows = summarize(runs, expected, names, modes, reference)
    print_table(rows, runs, expected, args, drop_ok, reference)
    tg = targets(rows, runs) if args.device == "cpu" else []
    report_targets(tg)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"settings": vars(args), "expected": expected, "rows": rows, "runs": runs,
                       "targets": [{"target": w, "met": ok, "detail": d} for w, ok, d in tg],
                       "drop_caches_works": drop_ok}, f, indent=1)
    bad = [r for r in rows if r["identical"] is False or not r["cache_ok"]]
    if bad:
        print("\nbench: " + "; ".join(f"{r['label']} ({r['mode']}): " + ("DIFFERENT TENSORS" if r["identical"] is False
                                      else "page cache not as asked") for r in bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
