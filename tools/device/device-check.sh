#!/usr/bin/env bash
# The one prepared script for a CUDA host (H200, torch 2.11+cu130 with Python 3.12 in its python3,
# nvcc, meson, ninja; no network, no pkg-config, no zstd/xxHash/GoogleTest development files):
#   here:    tools/device/device-prep.sh       (those packages and pkgconf, into .device-deps/)
#   device:  bash tools/device/device-check.sh (device tool: carry=[".device-deps"], timeout 600)
#
# Made so the one try cannot be wasted:
#   preflight      everything missing, listed at once, before anything is built; without what
#                  the build needs, the build steps are skipped (a minute lost, not the try)
#   configure      against the carried packages only: the carried pkgconf (through a wrapper),
#                  .pc files relative to themselves, an rpath into the carried tree
#   carried-flags  no compile or link flag points into the host's /usr (check_carried.py)
#   build-core     the tools and the Python module first (ninja -k 0)
#   carried-built  the headers really included and the libraries really loaded are the carried
#   oom-repro      tools/bench/oom_repro.py: torch.load must OOM, zckpt in place must succeed,
#                  bit-identical; the least free memory each method needs (bisection)
#   build-tests    the loader, save and simulator suites (ninja -k 0: one broken target costs only
#                  itself)
#   carried-tests  as carried-built, with GoogleTest's headers and libraries now in use
#   tests          loader_cuda first, then the loader, save and cudasim suites, then pytest
#                  tests/python/test_oom.py and every Python case that puts tensors on a device
#                  (-k cuda: test_load_into, test_map_location, test_save, test_dcp)
#   gpu-bench      tools/bench/bench.py --device cuda (2 warm rounds, shuffled, every result checked)
# Every step has a time budget, cut to what is left of ZCKPT_DEVICE_SECONDS (default 540) so the
# script ends, with its results written, inside the tool's 600 s. After every step it rewrites
# $OUT/summary.json and $OUT/logs.tar.gz (every log); the OOM and benchmark JSON are copied to
# $OUT too: 4 files in all (the tool brings back at most 8).
#
# Without a GPU (a rehearsal on a development machine) the GPU steps say so: oom-repro runs
# --rehearse (every code path on the CPU), gpu-bench is skipped, CUDA test cases skip.
#
# Environment: OUT (default /tmp/zckpt-device-out), ZCKPT_DEVICE_PYTHON (python3),
# ZCKPT_DEVICE_BUILD (build-device), ZCKPT_DEVICE_WORK (/tmp/zckpt-device: large files, logs),
# ZCKPT_DEVICE_SECONDS (540), ZCKPT_DEVICE_BUDGET_SCALE (1; a rehearsal on 2 cores needs ~10).
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
OUT=${OUT:-/tmp/zckpt-device-out}
PY=${ZCKPT_DEVICE_PYTHON:-python3}
BUILD=${ZCKPT_DEVICE_BUILD:-build-device}
WORK=${ZCKPT_DEVICE_WORK:-/tmp/zckpt-device}
TOTAL=${ZCKPT_DEVICE_SECONDS:-540}
SCALE=${ZCKPT_DEVICE_BUDGET_SCALE:-1}
JOBS=$(nproc)
LOGS=$WORK/logs
mkdir -p "$OUT" "$WORK"
rm -rf "$LOGS" && mkdir -p "$LOGS"
: > "$LOGS/steps.tsv"
START=$(date +%s)
exec > >(tee "$LOGS/device-check.log") 2>&1

summarize() {  # summary.json + logs.tar.gz, after every step
  python3 "$SRC/tools/build/device_summary.py" --logs "$LOGS" --out "$OUT/summary.json" "$@" \
    || "$PY" "$SRC/tools/build/device_summary.py" --logs "$LOGS" --out "$OUT/summary.json" "$@"
  tar -czf "$OUT/logs.tar.gz.tmp" -C "$WORK" logs 2>/dev/null && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
  for f in oom.json bench-cuda.json; do [ -f "$LOGS/$f" ] && cp "$LOGS/$f" "$OUT/$f"; done
  return 0
}
record() {  # record NAME RC SECONDS BUDGET STATUS
  printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$LOGS/steps.tsv"
  summarize
}
skip_step() {  # skip_step NAME REASON
  printf '\n=== %s: skipped (%s)\n' "$1" "$2"
  echo "skipped: $2" > "$LOGS/$1.log"
  record "$1" "" 0 0 skipped
}
run_step() {  # run_step NAME SECONDS CMD...: runs CMD with its log in $LOGS/NAME.log
  local name=$1 secs=$(( $2 * SCALE )); shift 2
  local left=$(( TOTAL * SCALE - ($(date +%s) - START) ))
  (( secs > left )) && secs=$left
  printf '\n=== %s (%s, %ss elapsed, budget %ss)\n' "$name" "$(date +%T)" "$(( $(date +%s) - START ))" "$secs"
  if (( secs < 10 )); then skip_step "$name" "no time left"; return 1; fi
  local t0=$(date +%s)
  timeout "$secs" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  local status=ok
  (( rc == 124 )) && status=timeout
  (( rc != 0 && rc != 124 )) && status=failed
  [ "$name" = preflight ] && (( rc == 1 )) && status=incomplete  # something non-fatal missing
  tail -n 25 "$LOGS/$name.log"
  echo "[$name] $status (exit $rc, $(( $(date +%s) - t0 ))s of ${secs}s)"
  record "$name" "$rc" "$(( $(date +%s) - t0 ))" "$secs" "$status"
  return $rc
}

# --- the carried packages: found through them only ----------------------------------------------
DEPS=$SRC/.device-deps/root
DEPS_LIBS=$DEPS/usr/lib/x86_64-linux-gnu:$DEPS/lib/x86_64-linux-gnu
mkdir -p "$WORK/bin"
cat > "$WORK/bin/pkg-config" <<EOF
#!/bin/sh
# The carried pkgconf, finding its own libpkgconf in the carried tree (and nothing else changed).
LD_LIBRARY_PATH="$DEPS_LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$DEPS/usr/bin/pkgconf" "\$@"
EOF
chmod +x "$WORK/bin/pkg-config"
export PKG_CONFIG="$WORK/bin/pkg-config"
export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# Our binaries find the carried libzstd/libxxhash/libz through their rpath; no process-wide
# LD_LIBRARY_PATH (it would hand the carried libraries to torch and Python as well).
export LDFLAGS="-Wl,-rpath,$DEPS/usr/lib/x86_64-linux-gnu -Wl,-rpath,$DEPS/lib/x86_64-linux-gnu${LDFLAGS:+ $LDFLAGS}"

# meson and ninja as pip installs them, should they not be on PATH.
if ! command -v meson >/dev/null && "$PY" -c 'import mesonbuild' 2>/dev/null; then
  printf '#!/bin/sh\nexec "%s" -m mesonbuild.mesonmain "$@"\n' "$(command -v "$PY")" > "$WORK/bin/meson"
  chmod +x "$WORK/bin/meson"
fi
NINJA_DIR=$("$PY" -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null)
command -v ninja >/dev/null || { [ -n "$NINJA_DIR" ] && ln -sf "$NINJA_DIR/ninja" "$WORK/bin/ninja"; }
export PATH="$PATH:$WORK/bin"

# --- host -----------------------------------------------------------------------------------------
printf '=== host (%s)\n' "$(date +%T)"
{ uname -a; nproc; free -g | head -2; df -h /tmp "$SRC" | tail -n +2
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1
  nvcc --version 2>&1 | tail -1; "$PY" --version; } | tee "$LOGS/host.log"

run_step preflight 60 "$PY" tools/build/device_preflight.py --python "$PY" --deps "$DEPS" --pkg-config "$PKG_CONFIG" \
  --work "$WORK" --out "$LOGS/preflight.json"
pre=$?
GPU=$("$PY" -c 'import json, sys; print(int(bool(json.load(open(sys.argv[1]))["probe"].get("gpu"))))' "$LOGS/preflight.json" 2>/dev/null || echo 0)
EXT=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)

if (( pre == 2 )) || [ -z "$EXT" ]; then
  for s in configure carried-flags build-core carried-built oom-repro build-tests carried-tests tests gpu-bench; do
    skip_step "$s" "preflight found something fatal missing"
  done
else
  WIPE=(); [ -f "$BUILD/build.ninja" ] && WIPE=(--wipe)  # a fresh folder cannot be wiped
  run_step configure 90 meson setup "$BUILD" "${WIPE[@]}" -Dpython="$(command -v "$PY")" -Dcuda=enabled -Dtorch=enabled \
    -Dtests=enabled -Dpython_module=enabled -Dbuildtype=release
  configured=$?
  if (( configured == 0 )); then
    run_step carried-flags 30 "$PY" tools/build/check_carried.py "$BUILD" "$DEPS"
    run_step build-core 200 ninja -C "$BUILD" -k 0 -j "$JOBS" tools/zckpt "src/python/zckpt/_C$EXT"
    core=$?
    run_step carried-built 30 "$PY" tools/build/check_carried.py "$BUILD" "$DEPS" --built
  else
    for s in carried-flags build-core carried-built; do skip_step "$s" "configure failed"; done
    core=1
  fi
  if (( core != 0 )); then
    skip_step oom-repro "the tools or the Python module did not build"
  else
    OOM_ARGS=(--zckpt "$BUILD/tools/zckpt" --workdir "$WORK/oom" --out "$LOGS/oom.json")
    (( GPU )) || OOM_ARGS+=(--rehearse)
    run_step oom-repro 170 env PYTHONPATH="$BUILD/src/python" PYTHONUNBUFFERED=1 "$PY" tools/bench/oom_repro.py "${OOM_ARGS[@]}"
  fi
  if (( configured == 0 )); then
    mapfile -t TEST_TARGETS < <(meson introspect --targets "$BUILD" | "$PY" -c '
import json, os, sys
for t in json.load(sys.stdin):
    if t["type"] == "executable" and (t["name"].startswith("loader_") or t["name"] in ("cudasim_engine", "save_test")):
        print(os.path.relpath(t["filename"][0], sys.argv[1]))' "$BUILD")
    run_step build-tests 150 ninja -C "$BUILD" -k 0 -j "$JOBS" "${TEST_TARGETS[@]}"
    run_step carried-tests 30 "$PY" tools/build/check_carried.py "$BUILD" "$DEPS" --built  # gtest's headers now
    # The CUDA suite first: the rest may run out of time, not it.
    mapfile -t OTHER_TESTS < <(meson introspect --tests "$BUILD" | "$PY" -c '
import json, sys
for t in json.load(sys.stdin):
    if any(s.split(":")[-1] in ("loader", "cudasim", "save") for s in t["suite"]) and t["name"] != "loader_cuda":
        print(t["name"])')
    run_step tests 120 bash -c '
      build=$1 logs=$2 py=$3; shift 3
      status=0
      meson test -C "$build" --no-rebuild --print-errorlogs loader_cuda || status=1
      cp "$build/meson-logs/testlog.junit.xml" "$logs/loader-cuda.junit.xml"
      meson test -C "$build" --no-rebuild --print-errorlogs --num-processes "$(nproc)" "$@" || status=1
      cp "$build/meson-logs/testlog.junit.xml" "$logs/loader-save-cudasim.junit.xml"
      ZCKPT_BIN=$PWD/$build/tools/zckpt ZCKPT_BUILD_ROOT=$PWD/$build PYTHONPATH=$PWD/$build/src/python \
        "$py" -m pytest -q -p no:cacheprovider tests/python/test_oom.py --junitxml="$logs/pytest-oom.junit.xml" || status=1
      # Every Python case that puts tensors on a device: LoadInto, map_location, save (its CUDA
      # ring), DCP save/load (LoadRegions into CUDA targets).
      ZCKPT_BIN=$PWD/$build/tools/zckpt ZCKPT_BUILD_ROOT=$PWD/$build PYTHONPATH=$PWD/$build/src/python \
        "$py" -m pytest -q -p no:cacheprovider -k cuda tests/python/test_load_into.py tests/python/test_map_location.py \
        tests/python/test_save.py tests/python/test_dcp.py --junitxml="$logs/pytest-cuda.junit.xml" || status=1
      exit $status' _ "$BUILD" "$LOGS" "$PY" "${OTHER_TESTS[@]}"
  else
    for s in build-tests carried-tests tests; do skip_step "$s" "configure failed"; done
  fi
  if (( core != 0 )); then
    skip_step gpu-bench "the tools or the Python module did not build"
  elif (( ! GPU )); then
    skip_step gpu-bench "needs a GPU"
  else
    run_step gpu-bench 200 env PYTHONPATH="$BUILD/src/python" PYTHONUNBUFFERED=1 "$PY" tools/bench/bench.py \
      --device cuda --gib 2 --rounds 2 --modes warm --zckpt "$BUILD/tools/zckpt" \
      --workdir "$WORK/bench" --out "$LOGS/bench-cuda.json"
  fi
fi

summarize --print
echo "results: $OUT/summary.json, $OUT/logs.tar.gz (every log)$( [ -f "$OUT/oom.json" ] && echo ", $OUT/oom.json")$( [ -f "$OUT/bench-cuda.json" ] && echo ", $OUT/bench-cuda.json")"
