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

# The device tool allows 600 s per command and 15 min per session: every step gets its own
# budget, cut to what is left of ZCKPT_DEVICE_SECONDS (default 540) so the script always ends,
# with $OUT written, before the command's limit.
TOTAL=${ZCKPT_DEVICE_SECONDS:-540}
: > "$OUT/steps.txt"
START=$(date +%s)
step() { printf '\n=== %s (%s, %ss elapsed)\n' "$1" "$(date +%T)" "$(( $(date +%s) - START ))"; }
run_step() {  # run_step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local left=$(( TOTAL - ($(date +%s) - START) ))
  (( secs > left )) && secs=$left
  step "$name"
  if (( secs < 10 )); then
    echo "[$name] skipped: no time left"; echo "$name skipped" >> "$OUT/steps.txt"; return 0
  fi
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "[$name] exit $rc (budget ${secs}s)"
  echo "$name $rc" >> "$OUT/steps.txt"
  return 0
}

step "host"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee "$OUT/gpu.txt"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1 | tee "$OUT/torch.txt"
nproc; free -g | head -2

# Packages carried from the dev machine (tools/device-prep.sh): headers, .pc files, libraries.
DEPS=$PWD/.device-deps/root
if [ -d "$DEPS" ]; then
  # Their .pc files say prefix=/usr: point copies at the carried tree. (PKG_CONFIG_SYSROOT_DIR
  # would also prefix the host's own python3.pc and lose Python.h.)
  PCDIR=$(mktemp -d)
  for pc in "$DEPS"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$DEPS"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] || continue  # a folder with no .pc file leaves its pattern unexpanded
    # (nlohmann_json.pc names /usr/include outright, with no prefix variable.)
    sed -e "s|^prefix=/usr\$|prefix=$DEPS/usr|" -e "s|-I/usr/include\$|-I$DEPS/usr/include|" "$pc" > "$PCDIR/$(basename "$pc")"
  done
  export PKG_CONFIG_PATH="$PCDIR:${PKG_CONFIG_PATH:-}"
  # Shared, not static: Debian's libzstd.a is not PIC, and libzckpt is a shared library. The
  # runtime packages came along too; the tests and benchmarks find them here.
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi

WIPE=(); [ -f "$BUILD/build.ninja" ] && WIPE=(--wipe)  # a fresh folder cannot be wiped
run_step configure 90 meson setup "$BUILD" "${WIPE[@]}" -Dpython="$(command -v "$PY")" -Dcuda=enabled -Dtorch=enabled
# Only what the device checks need: the tool, the Python module, the loader suites.
run_step build 240 ninja -C "$BUILD" -j "$(nproc)" tools/zckpt tools/zckpt-load \
  "src/python/zckpt/_C$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" \
  tests/loader/loader_{plan,load,failure,into,map,memory,cuda}_test
run_step loader-tests 90 meson test -C "$BUILD" --suite loader --print-errorlogs --no-rebuild
cp "$BUILD"/meson-logs/testlog.txt "$OUT/loader-testlog.txt" 2>/dev/null
run_step oom-repro 120 env PYTHONPATH="$BUILD/src/python" "$PY" tools/bench/oom_repro.py --zckpt "$BUILD/tools/zckpt" --gib 4 --workdir /tmp/zckpt-oom --out "$OUT/oom.json"
run_step gpu-bench 200 env PYTHONPATH="$BUILD/src/python" "$PY" tools/bench/bench_load.py --device cuda --gib 2 --repeat 2 --zckpt "$BUILD/tools/zckpt" --workdir /tmp/zckpt-bench --out "$OUT/bench-cuda.json"
step "summary"
cat "$OUT/steps.txt"
