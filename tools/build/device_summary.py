"""Writes tools/device/device-check.sh's one summary JSON from its logs folder; run after every step so
a later failure (or the command's time limit) loses nothing. Standard library only.

    device_summary.py --logs LOGS --out summary.json [--print]

Reads LOGS/steps.tsv (name, exit status, seconds, budget, status a line), LOGS/preflight.json,
LOGS/oom.json, LOGS/bench-cuda.json, LOGS/*.junit.xml and LOGS/*.log (last lines of failed
steps). --print also prints it as a short table (the end of the command's output is what the
device tool hands back).
"""
import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tail(path, n=8):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []


def junit_counts(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = {"passed": 0, "failed": 0, "skipped": 0, "failed_names": []}
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            counts["failed_names"].append(f"{case.get('classname', '')}.{case.get('name', '')}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--print", action="store_true")
    args = ap.parse_args()
    steps = []
    try:
        with open(os.path.join(args.logs, "steps.tsv")) as f:
            for line in f:
                name, rc, secs, budget, status = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
                step = {"name": name, "rc": int(rc) if rc.lstrip("-").isdigit() else None, "seconds": float(secs or 0),
                        "budget": int(budget or 0), "status": status}
                if status not in ("ok", "skipped"):
                    step["log_tail"] = tail(os.path.join(args.logs, name + ".log"))
                steps.append(step)
    except OSError:
        pass
    summary = {"steps": steps}
    pre = load(os.path.join(args.logs, "preflight.json"))
    if pre:
        summary["preflight"] = {"missing": pre.get("missing"), "fatal": pre.get("fatal"),
                                "torch": pre.get("probe", {}).get("torch"), "python": pre.get("probe", {}).get("python"),
                                "gpu": pre.get("probe", {}).get("gpu_name")}
    oom = load(os.path.join(args.logs, "oom.json"))
    if oom:
        summary["oom"] = {"assertions": oom.get("assertions"), "rehearsal": oom.get("rehearsal"),
                          "shard_bytes": oom.get("shard_bytes"),
                          "cases": {k: {x: v.get(x) for x in ("outcome", "seconds", "bit_identical", "extra_allocated_peak",
                                                              "extra_reserved_peak", "free_before", "error_type")
                                        if x in v} for k, v in oom.get("cases", {}).items()},
                          "least_free": {k: {"least": v.get("least"), "most_failing": v.get("most_failing"),
                                             "tries": len(v.get("tries", [])), "shard_bytes": v.get("shard_bytes")}
                                         for k, v in oom.get("least_free", {}).items()}}
    bench = load(os.path.join(args.logs, "bench-cuda.json"))
    if bench:
        # tools/bench/bench.py --out: one row per (contender, mode), medians over the rounds.
        summary["bench"] = [{k: r.get(k) for k in ("label", "mode", "n", "median", "ratio_median", "identical",
                                                   "device_peak_median", "device_reserved_peak_median",
                                                   "device_used_median")}
                            for r in bench.get("rows", [])]
    tests = {}
    for f in sorted(os.listdir(args.logs)):
        if f.endswith(".junit.xml"):
            c = junit_counts(os.path.join(args.logs, f))
            if c:
                tests[f[: -len(".junit.xml")]] = c
    if tests:
        summary["tests"] = tests
    carried = [line for step in ("carried-flags", "carried-built", "carried-tests")
               for line in tail(os.path.join(args.logs, step + ".log"), 1) if line.startswith("carried:")]
    if carried:
        summary["carried"] = carried
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, args.out)

    if args.print:
        print("\n=== summary")
        for s in steps:
            print(f"  {s['name']:16} {s['status']:8} rc {s['rc']!s:4} {s['seconds']:6.0f} s of {s['budget']}")
        if pre:
            print(f"  preflight missing: {', '.join(pre.get('missing') or []) or 'nothing'}")
        for line in carried:
            print(f"  {line}")
        for name, c in tests.items():
            print(f"  tests {name}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
                  + (f" ({', '.join(c['failed_names'][:6])})" if c["failed_names"] else ""))
        if oom:
            for k, v in (oom.get("assertions") or {}).items():
                print(f"  oom {'ok  ' if v else 'FAIL'} {k}")
            for k, v in summary["oom"]["least_free"].items():
                least = "n/a" if v["least"] is None else f"{v['least'] / 2**20:.0f} MiB"
                print(f"  least free beyond the shard: {k:40} {least}")
        if bench:
            for r in summary["bench"]:
                dev = r.get("device_reserved_peak_median")
                print(f"  bench {r['label']:40} {r['mode']} median {r['median']:.3f} s"
                      + (f", reserved peak {dev / 2**20:.0f} MiB" if dev is not None else "")
                      + ("" if r.get("identical") is not False else ", tensors DIFFER"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
