"""The motivating failure, reproduced on a CUDA host, and zckpt's way out; and the headline
figure: for each way of loading, the least free device memory with which it succeeds.

A resume beside an inference engine: the model (the destination) already lives on the GPU and
ballast holds the rest of the card but a little. A shard saved from CUDA tensors:

  in place (the destination exists; 1 GiB left free):
    torch.load(path) + copy          revives every storage on cuda: a second copy -> must OOM
    zckpt.load_into(container, ...)  streams into the existing tensors -> must succeed,
                                     bit-identical, every data_ptr kept
    torch.load(map_location="cpu") + load_state_dict-style copy_   (host RAM = the shard)
    safetensors load_file(cpu) + copy_, safetensors load_file(cuda) + copy_
  new tensors (no destination yet; shard + 4 MiB + 256 MiB free):
    zckpt.load(map_location="cuda") -> must succeed, bit-identical
    torch.load(map_location="cuda"), safetensors load_file(cuda)
  least free memory (on a smaller shard, --bisect-gib): each method above run against ballast
    leaving less and less free, bisected down to --resolution-mib; reported as bytes beyond the
    shard's own (in place: beyond the resident destination) that the method needed.

Every value check runs after the ballast is freed (a check needs memory of its own). Each
case's outcome is written to --out as soon as it completes (the file is rewritten, atomically,
after every case), so a later failure or the command's time limit loses nothing. Outcomes are
asserted at the end (exit 1 when one does not hold).

--rehearse runs every code path on the CPU with a small shard and no ballast (no GPU needed):
the methods, the checks, the report and the bisection (against a synthetic memory model), so
the one try on a GPU host does not die of a script error.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch

import zckpt
from contenders import host_memory, reset_peak  # tools/bench, beside this script

MIB = 1 << 20
GIB = 1 << 30


class Report:
    def __init__(self, path, **head):
        self.path = path
        self.data = dict(head, cases={}, least_free={}, assertions={})
        self.write()

    def write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)

    def case(self, name, outcome):
        self.data["cases"][name] = outcome
        self.write()
        print(f"[oom] {name}: {json.dumps(outcome, default=str)}", flush=True)

    def least(self, name, outcome):
        self.data["least_free"][name] = outcome  # every try is in the JSON
        self.write()
        brief = {k: outcome.get(k) for k in ("least", "most_failing", "seconds")}
        print(f"[oom] least free, {name}: {json.dumps(brief, default=str)} after {len(outcome['tries'])} tries", flush=True)


class Card:
    """The device: free memory, ballast, and cleaning up between tries (no-ops on the CPU)."""

    def __init__(self, device):
        self.device = device
        self.cuda = device.startswith("cuda")

    def free(self):
        return torch.cuda.mem_get_info()[0] if self.cuda else None

    def clean(self):
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def ballast(self, leave_free):
        """One block (2 MiB granules, at least 10 MiB so the caching allocator gives it a segment
        of its own size) leaving about `leave_free` bytes free; [] when that much is not free."""
        if not self.cuda:
            return []
        self.clean()
        gap = (self.free() - leave_free) // (2 * MIB) * (2 * MIB)
        if gap < 10 * MIB:
            return []
        return [torch.empty(gap, dtype=torch.uint8, device=self.device)]

    def peaks_reset(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        return 0, 0

    def peaks(self, before):
        if not self.cuda:
            return {}
        return {"extra_allocated_peak": torch.cuda.max_memory_allocated() - before[0],
                "extra_reserved_peak": torch.cuda.max_memory_reserved() - before[1]}




# ---------------------------------------------------------------- the shard and the methods


def make_shard(workdir, gib, device, zckpt_bin, tag):
    """A shard of 8192 x 8192 bf16 tensors (128 MiB each; smaller on --rehearse) made on
    `device`, saved with torch.save (as FSDP saves local shards), with safetensors, and converted.
    Returns (paths, reference on the CPU, bytes)."""
    from safetensors.torch import save_file

    side = 8192 if gib >= 0.5 else 1024
    n = max(1, int(gib * GIB / (side * side * 2)))
    torch.manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(side, side, device=device, dtype=torch.bfloat16) for i in range(n)}
    paths = {k: os.path.join(workdir, f"shard-{tag}.{k}") for k in ("pt", "safetensors", "zckpt")}
    torch.save(state, paths["pt"])
    save_file(state, paths["safetensors"])
    subprocess.run([zckpt_bin, "convert", paths["pt"], "-o", paths["zckpt"], "--quiet", "--force"], check=True)
    reference = {k: v.cpu() for k, v in state.items()}
    nbytes = sum(v.numel() * v.element_size() for v in reference.values())
    del state
    return paths, reference, nbytes


def copy_into(model, sd):
    with torch.no_grad():
        for k, t in model.items():
            t.copy_(sd[k])


def m_torch_load_copy(paths, model, device):
    copy_into(model, torch.load(paths["pt"], weights_only=True))  # revives on the saved device


def m_torch_load_cpu_copy(paths, model, device):
    copy_into(model, torch.load(paths["pt"], map_location="cpu", weights_only=True))


def m_zckpt_load_into(paths, model, device):
    zckpt.load_into(paths["zckpt"], model)


def m_safetensors_cpu_copy(paths, model, device):
    from safetensors.torch import load_file

    copy_into(model, load_file(paths["safetensors"], device="cpu"))


def m_safetensors_dev_copy(paths, model, device):
    from safetensors.torch import load_file

    copy_into(model, load_file(paths["safetensors"], device=device))


def m_zckpt_load(paths, model, device):
    return zckpt.load(paths["zckpt"], map_location=device)


def m_torch_load_dev(paths, model, device):
    return torch.load(paths["pt"], map_location=device, weights_only=True)


def m_safetensors_dev(paths, model, device):
    from safetensors.torch import load_file

    return load_file(paths["safetensors"], device=device)


IN_PLACE = {  # name -> (function, what it costs the host)
    "torch.load + copy_": m_torch_load_copy,
    "zckpt.load_into": m_zckpt_load_into,
    "torch.load(map_location=cpu) + copy_": m_torch_load_cpu_copy,
    "safetensors load_file(cpu) + copy_": m_safetensors_cpu_copy,
    "safetensors load_file(cuda) + copy_": m_safetensors_dev_copy,
}
NEW_TENSORS = {
    "zckpt.load(map_location=cuda)": m_zckpt_load,
    "torch.load(map_location=cuda)": m_torch_load_dev,
    "safetensors load_file(cuda)": m_safetensors_dev,
}


def run_method(card, fn, paths, model, leave_free):
    """Runs one method with ballast leaving `leave_free` bytes free; returns (outcome, result)."""
    ballast = card.ballast(leave_free) if leave_free is not None else []
    free = card.free()
    before = card.peaks_reset()
    reset_peak()
    rss0 = host_memory()["VmRSS"]
    t0 = time.perf_counter()
    out = {"free_before": free}
    result = None
    try:
        result = fn(paths, model, card.device)
        if card.cuda:
            torch.cuda.synchronize()
        out.update(outcome="ok", seconds=time.perf_counter() - t0)
        out.update(card.peaks(before))
    except torch.OutOfMemoryError as e:
        out.update(outcome="oom", error_type=f"{type(e).__module__}.{type(e).__name__}",
                   error=str(e).splitlines()[0][:300])
    except Exception as e:  # noqa: BLE001 -- recorded, asserted on later
        out.update(outcome="error", error_type=f"{type(e).__module__}.{type(e).__name__}", error=str(e)[:500])
    out["host_rss_peak_delta"] = host_memory()["VmHWM"] - rss0
    del ballast
    card.clean()
    return out, result


def bit_identical(tensors, reference):
    """After the ballast is gone: every tensor equal to its reference, bit for bit."""
    bad = [k for k, v in reference.items() if not torch.equal(tensors[k].detach().cpu().view(torch.int16), v.view(torch.int16))]
    return {"bit_identical": not bad, "differing": bad[:5]}


def fresh_model(reference, device):
    return {k: torch.zeros_like(v, device=device) for k, v in reference.items()}


# ---------------------------------------------------------------- least free memory (bisection)


def least_free(try_at, lo, hi, resolution, budget_s):
    """Smallest x in (lo, hi] (bytes) with try_at(x) succeeding, assuming failure below and
    success above it; try_at(x) -> (ok, details). Tries hi first, then lo, then bisects until
    hi - lo <= resolution or `budget_s` is spent. Returns a dict: least (smallest success seen),
    most_failing (largest failure seen), tries."""
    t0 = time.perf_counter()
    tries = []

    def attempt(x):
        ok, details = try_at(x)
        tries.append({"extra_free": x, "ok": ok, **details})
        return ok

    if not attempt(hi):
        return {"least": None, "most_failing": hi, "note": f"failed even with {hi} bytes beyond the shard", "tries": tries}
    if attempt(lo):
        return {"least": lo, "most_failing": None, "tries": tries}
    while hi - lo > resolution and time.perf_counter() - t0 < budget_s:
        mid = (lo + hi) // 2 // (2 * MIB) * (2 * MIB)
        if mid <= lo or mid >= hi:
            break
        if attempt(mid):
            hi = mid
        else:
            lo = mid
    return {"least": hi, "most_failing": lo, "resolution": hi - lo, "seconds": time.perf_counter() - t0, "tries": tries}


def bisect_all(report, card, paths, reference, nbytes, args):
    for name, fn in {**IN_PLACE, **NEW_TENSORS}.items():
        in_place = name in IN_PLACE

        def try_at(extra, fn=fn, in_place=in_place):
            model = fresh_model(reference, card.device) if in_place else None
            out, result = run_method(card, fn, paths, model, extra if in_place else nbytes + extra)
            del model, result
            card.clean()
            details = {k: out[k] for k in ("free_before", "outcome", "error_type") if k in out}
            return out["outcome"] == "ok", details

        if args.rehearse:  # no ballast on a CPU: a synthetic card where each method needs 100 MiB extra
            def try_at(extra, real=try_at):  # noqa: F811
                ok, details = real(extra)
                return ok and extra >= 100 * MIB, dict(details, synthetic_card="needs 100 MiB")

        hi = nbytes + args.headroom_mib * MIB
        r = least_free(try_at, 0, hi, args.resolution_mib * MIB, args.bisect_seconds / 8)
        r["in_place"] = in_place
        r["shard_bytes"] = nbytes
        r["meaning"] = ("free device memory needed beyond the resident destination" if in_place
                        else "free device memory needed beyond the shard's own bytes")
        report.least(name, r)


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zckpt", required=True, help="the zckpt tool (for convert)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gib", type=float, default=4.0, help="shard of the headline cases")
    ap.add_argument("--bisect-gib", type=float, default=1.0, help="shard of the least-free bisection (0: skip it)")
    ap.add_argument("--bisect-seconds", type=float, default=80, help="time for the whole bisection")
    ap.add_argument("--resolution-mib", type=int, default=32)
    ap.add_argument("--headroom-mib", type=int, default=512, help="bisection's upper bound beyond the shard")
    ap.add_argument("--in-place-free-mib", type=int, default=1024)
    ap.add_argument("--rehearse", action="store_true", help="CPU dry run of every code path (no GPU)")
    args = ap.parse_args()
    if args.rehearse:
        device = "cpu"
        args.gib, args.bisect_gib = min(args.gib, 1 / 16), min(args.bisect_gib, 1 / 32) if args.bisect_gib else 0
    else:
        if not torch.cuda.is_available():
            sys.exit("oom_repro: needs a GPU (torch.cuda.is_available() is False); --rehearse runs it on the CPU")
        device = "cuda:0"
    os.makedirs(args.workdir, exist_ok=True)
    card = Card(device)
    report = Report(args.out, device=device, rehearsal=args.rehearse, torch=torch.__version__, gib=args.gib,
                    total=torch.cuda.mem_get_info()[1] if card.cuda else None)
    paths, reference, nbytes = make_shard(args.workdir, args.gib, device, args.zckpt, "main")
    report.data["shard_bytes"] = nbytes
    report.write()
    leave = None if args.rehearse else args.in_place_free_mib * MIB
    a = report.data["assertions"]

    # 1. In place: the destination exists, the card is otherwise full but --in-place-free-mib.
    model = fresh_model(reference, device)
    ptrs = {k: v.data_ptr() for k, v in model.items()}
    for name, fn in IN_PLACE.items():
        for t in model.values():
            t.zero_()
        out, _ = run_method(card, fn, paths, model, leave)
        if out["outcome"] == "ok":  # ballast gone: check the values now
            out.update(bit_identical(model, reference))
            out["data_ptr_kept"] = all(ptrs[k] == v.data_ptr() for k, v in model.items())
        report.case("in place: " + name, out)
    del model
    card.clean()
    c = report.data["cases"]
    a["plain torch.load in place runs out of memory"] = c["in place: torch.load + copy_"]["outcome"] == "oom"
    z = c["in place: zckpt.load_into"]
    a["zckpt.load_into succeeds"] = z["outcome"] == "ok"
    a["zckpt.load_into is bit-identical, every data_ptr kept"] = bool(z.get("bit_identical") and z.get("data_ptr_kept"))

    # 2. New tensors: no destination yet; the shard + one chunk + 256 MiB free.
    for name, fn in NEW_TENSORS.items():
        out, result = run_method(card, fn, paths, None, None if args.rehearse else nbytes + 4 * MIB + 256 * MIB)
        if out["outcome"] == "ok":
            out.update(bit_identical(result, reference))
        del result
        card.clean()
        report.case("new tensors: " + name, out)
    z = c["new tensors: zckpt.load(map_location=cuda)"]
    a["zckpt.load succeeds with the shard + 260 MiB free"] = z["outcome"] == "ok"
    a["zckpt.load is bit-identical"] = bool(z.get("bit_identical"))

    # 3. The least free memory each method needs.
    if args.bisect_gib:
        del reference
        card.clean()
        paths, reference, nbytes = make_shard(args.workdir, args.bisect_gib, device, args.zckpt, "bisect")
        bisect_all(report, card, paths, reference, nbytes, args)
        zl = report.data["least_free"]
        zckpt_fails = [t for n in ("zckpt.load_into", "zckpt.load(map_location=cuda)") for t in zl[n]["tries"] if not t["ok"]]
        if not args.rehearse:
            a["zckpt's out-of-memory errors are torch.OutOfMemoryError"] = all(
                t.get("error_type") == "zckpt._C.OutOfMemoryError" for t in zckpt_fails)
    report.write()

    print("\n[oom] assertions" + (" (rehearsal: recorded, not enforced)" if args.rehearse else ""))
    for k, v in a.items():
        print(f"  {'ok  ' if v else 'FAIL'} {k}")
    if report.data["least_free"]:
        print(f"\n[oom] least free device memory beyond the shard's bytes ({report.data['least_free'][next(iter(report.data['least_free']))]['shard_bytes'] / MIB:.0f} MiB shard)")
        for name, r in report.data["least_free"].items():
            least = "n/a" if r["least"] is None else f"{r['least'] / MIB:.0f} MiB"
            print(f"  {name:40} {least:>10}  ({len(r['tries'])} tries{', in place' if r['in_place'] else ''})")
    return 0 if args.rehearse or all(a.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
