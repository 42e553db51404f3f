#!/usr/bin/env bash
# The one prepared script for a CUDA host (H200, torch 2.x in its python3, nvcc, meson, ninja,
# no network). Builds against that host's torch, runs the CUDA tests and the loader suites,
# reproduces the motivating failure (torch.load OOMs on a card filled with ballast, zckpt
# loads in place), runs the GPU benchmark, and writes everything under $OUT.
#   here:    tools/device-prep.sh              (packages the host lacks, into .device-deps/)
#   device:  bash tools/device-check.sh        (with carry=[".device-deps"])
# Each step has its own time budget and its own log, so one failure does not hide the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/zckpt-device-out}
mkdir -p "$OUT"
PY=${ZCKPT_DEVICE_PYTHON:-python3}
BUILD=${ZCKPT_DEVICE_BUILD:-build-device}
exec > >(tee "$OUT/device-check.log") 2>&1

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }
run_step() {  # run_step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  step "$name"
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "[$name] exit $rc"
  echo "$name $rc" >> "$OUT/steps.txt"
  return 0
}

step "host"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee "$OUT/gpu.txt"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1 | tee "$OUT/torch.txt"
nproc; free -g | head -2

# Packages carried from the dev machine: static libraries, so nothing is needed at run time.
DEPS=$PWD/.device-deps/root
if [ -d "$DEPS" ]; then
  export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
  export PKG_CONFIG_SYSROOT_DIR="$DEPS"
  EXTRA=(-Dprefer_static=true -Dcpp_args=-I$DEPS/usr/include -Dc_args=-I$DEPS/usr/include)
else
  EXTRA=()
fi

run_step configure 240 meson setup "$BUILD" --wipe -Dpython="$(command -v "$PY")" -Dcuda=enabled -Dtorch=enabled "${EXTRA[@]}"
unset PKG_CONFIG_SYSROOT_DIR
run_step build 420 ninja -C "$BUILD" -j "$(nproc)"
run_step loader-tests 300 meson test -C "$BUILD" --suite loader --print-errorlogs
cp "$BUILD"/meson-logs/testlog.txt "$OUT/loader-testlog.txt" 2>/dev/null
run_step oom-repro 300 env PYTHONPATH="$BUILD/src/python" "$PY" tools/bench/oom_repro.py --zckpt "$BUILD/tools/zckpt" --workdir /tmp/zckpt-oom --out "$OUT/oom.json"
run_step gpu-bench 420 env PYTHONPATH="$BUILD/src/python" "$PY" tools/bench/bench_load.py --device cuda --gib 4 --zckpt "$BUILD/tools/zckpt" --workdir /tmp/zckpt-bench --out "$OUT/bench-cuda.json"
step "summary"
cat "$OUT/steps.txt"
