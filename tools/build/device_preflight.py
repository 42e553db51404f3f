"""Preflight of tools/device/device-check.sh: everything the GPU run needs, checked before anything is
built, every missing piece listed at once (not the first one only).

    device_preflight.py --python PY --deps DEPS_ROOT --pkg-config WRAPPER --out preflight.json

Each check is `ok` or MISSING, and `fatal` when the build cannot start without it (then
device-check.sh skips the build and the GPU steps, having lost a minute instead of the try).
Exit status: 0 all there, 1 something non-fatal missing, 2 something fatal missing.
Imports nothing beyond the standard library; torch is probed in a child process.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CARRIED_PC = ["libzstd", "libxxhash", "zlib", "gtest", "gtest_main", "nlohmann_json"]
CARRIED_HEADERS = ["zstd.h", "xxhash.h", "zlib.h", "gtest/gtest.h", "nlohmann/json.hpp"]

PROBE = r"""
import json, os, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda or "",
               gpu=torch.cuda.is_available(), gpus=torch.cuda.device_count(),
               torch_dir=os.path.dirname(torch.__file__))
    if out["gpu"]:
        out["gpu_name"] = torch.cuda.get_device_name(0)
        out["gpu_free"], out["gpu_total"] = torch.cuda.mem_get_info()
except Exception as e:
    out["torch_error"] = repr(e)
for mod in ("numpy", "safetensors", "pytest"):
    try:
        out[mod] = __import__(mod).__version__
    except Exception as e:
        out[mod + "_error"] = repr(e)
import sysconfig
out["python_include"] = sysconfig.get_paths()["include"]
print(json.dumps(out))
"""


def run(cmd, env=None, timeout=60):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        return r.returncode, (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True)
    ap.add_argument("--deps", required=True)
    ap.add_argument("--pkg-config", required=True, help="the wrapper device-check.sh made around the carried pkgconf")
    ap.add_argument("--work", default="/tmp")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    checks = []

    def check(name, ok, detail="", fatal=False):
        checks.append({"name": name, "ok": bool(ok), "detail": detail, "fatal": fatal and not ok})
        print(f"{'ok     ' if ok else 'MISSING'} {name}: {detail}" + ("  [fatal]" if fatal and not ok else ""), flush=True)

    rc, text = run([args.python, "-c", PROBE], timeout=180)
    try:
        probe = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        probe = {"probe_error": text[-500:]}
    check("python", "python" in probe, probe.get("python", probe.get("probe_error", "")), fatal=True)
    check("torch", "torch" in probe, probe.get("torch", probe.get("torch_error", "")), fatal=True)
    check("torch is a CUDA build", bool(probe.get("torch_cuda")), probe.get("torch_cuda", "") or "CPU build", fatal=True)
    gpu = probe.get("gpu", False)
    check("GPU visible to torch", gpu,
          f"{probe.get('gpus', 0)} device(s)" + (f", {probe.get('gpu_name')}, {probe.get('gpu_free', 0) >> 20} MiB free of "
                                                 f"{probe.get('gpu_total', 0) >> 20}" if gpu else ""))
    check("nvidia-smi", shutil.which("nvidia-smi") is not None, shutil.which("nvidia-smi") or "not on PATH")
    for mod in ("numpy", "safetensors", "pytest"):
        check(f"python package {mod}", mod in probe, probe.get(mod, probe.get(mod + "_error", "")))
    torch_dir = probe.get("torch_dir", "")
    check("torch's pybind11 headers", os.path.isfile(os.path.join(torch_dir, "include", "pybind11", "pybind11.h")),
          os.path.join(torch_dir, "include", "pybind11"), fatal=True)
    py_inc = probe.get("python_include", "")
    check("Python.h", os.path.isfile(os.path.join(py_inc, "Python.h")), py_inc, fatal=True)

    meson = shutil.which("meson")
    rc, v = run([meson, "--version"]) if meson else (127, "not on PATH")
    check("meson >= 1.0", rc == 0 and tuple(int(x) for x in v.split(".")[:2]) >= (1, 0), f"{meson} {v}", fatal=True)
    ninja = shutil.which("ninja")
    check("ninja", ninja is not None, ninja or "not on PATH", fatal=True)
    for cc in ("cc", "c++"):
        path = shutil.which(cc)
        rc, v = run([path, "--version"]) if path else (127, "not on PATH")
        check(f"compiler {cc}", rc == 0, v.splitlines()[0] if rc == 0 else v, fatal=True)
    rc, inc = run([args.python, os.path.join(HERE, "cuda_include.py")])
    check("CUDA runtime headers", rc == 0 and inc.strip() != "", inc.replace("\n", " ") or "none (toolkit or torch's wheels)",
          fatal=True)

    # The carried packages (tools/device/device-prep.sh): present, found by the carried pkgconf, complete.
    check("carried packages (.device-deps)", os.path.isdir(args.deps), args.deps + " (run tools/device/device-prep.sh here and carry .device-deps)",
          fatal=True)
    if os.path.isdir(args.deps):
        rc, v = run([args.pkg_config, "--version"])
        check("carried pkgconf runs", rc == 0, v, fatal=True)
        for pc in CARRIED_PC:
            rc, flags = run([args.pkg_config, "--cflags", "--libs", pc])
            inside = rc == 0 and all(os.path.realpath(f[2:]).startswith(os.path.realpath(args.deps))
                                     for f in flags.split() if f.startswith(("-I", "-L")))
            check(f"pkg-config {pc}", inside, flags if rc == 0 else flags[-200:], fatal=True)
        for h in CARRIED_HEADERS:
            check(f"carried header {h}", os.path.isfile(os.path.join(args.deps, "usr", "include", h)), "", fatal=True)

    for where, need in ((args.work, 20), (os.getcwd(), 4)):
        os.makedirs(where, exist_ok=True)
        st = os.statvfs(where)
        free = st.f_bavail * st.f_frsize / 2**30
        check(f"disk space at {where} >= {need} GiB", free >= need, f"{free:.0f} GiB free")
    with open("/proc/meminfo") as f:
        mem = {l.split(":")[0]: int(l.split()[1]) for l in f}
    check("host memory >= 16 GiB available", mem.get("MemAvailable", 0) >= 16 << 20, f"{mem.get('MemAvailable', 0) >> 20} GiB available")
    check("cpus", True, str(os.cpu_count()))

    missing = [c["name"] for c in checks if not c["ok"]]
    fatal = [c["name"] for c in checks if c["fatal"]]
    result = {"checks": checks, "missing": missing, "fatal": fatal, "probe": probe}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"preflight: {len(checks) - len(missing)} of {len(checks)} there; missing: {', '.join(missing) or 'nothing'}"
          + (f"; FATAL: {', '.join(fatal)}" if fatal else ""))
    return 2 if fatal else 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
