#!/usr/bin/env bash
# Shows that the simulated-CUDA suite (tests/cudasim, cudasim_engine) catches a broken CUDA copy
# engine: builds the suite against the engine as it is and against each deliberately broken
# variant of src/loader/copy_engine_cuda.cc (ZCKPT_SIM_MUTANT, set only by meson -Dsim_mutant=N
# for that suite; libzckpt never sees it), runs it, and prints which tests failed for each:
#   0  the engine as it is                       must pass
#   1  slot released before its copy completed   must fail
#   2  no wait on the caller's stream            must fail
#   3  a Synchronize that does nothing           must fail
# Exits 0 when all four came out as they must. Torch-free; ~1 minute on 2 cores after the first
# build.
#
# Environment: ZCKPT_MUTANT_BUILD (build folder, default /tmp/zckpt-sim-mutants), ZCKPT_VENV (the
# Python whose site-packages may hold CUDA headers, default ~/.cache/zckpt/venv), ZCKPT_JOBS.
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
BUILD=${ZCKPT_MUTANT_BUILD:-/tmp/zckpt-sim-mutants}
VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
JOBS=${ZCKPT_JOBS:-2}
NAMES=("the engine as it is" "slot released before its copy completed" "no wait on the caller's stream"
       "a Synchronize that does nothing")

bash tools/build/check-build-dir.sh "$BUILD" "$SRC" || exit 2
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" -Dtorch=disabled -Dpython_module=disabled -Dfuzz=disabled -Dpython="$VENV/bin/python" \
    >"$BUILD.setup.log" 2>&1 || { cat "$BUILD.setup.log"; exit 2; }
fi
status=0
summary=()
for n in 0 1 2 3; do
  meson configure "$BUILD" -Dsim_mutant=$n >/dev/null || exit 2
  if ! ninja -C "$BUILD" -j "$JOBS" tests/cudasim/cudasim_engine >"$BUILD/mutant-$n.build.log" 2>&1; then
    tail -20 "$BUILD/mutant-$n.build.log"
    echo "mutant $n: the suite did not build (no CUDA runtime headers?)"
    exit 2
  fi
  log=$BUILD/mutant-$n.log
  timeout 600 "$BUILD/tests/cudasim/cudasim_engine" >"$log" 2>&1
  rc=$?
  failed=$(grep -E '^\[  FAILED  \] [A-Za-z]+\.[A-Za-z]+' "$log" | sed -E 's/^\[  FAILED  \] ([A-Za-z.]+).*/\1/' | sort -u | tr '\n' ' ')
  # Violations caught in the engine's tests (the simulator's own tests provoke some on purpose).
  violations=$(awk '/^\[ RUN      \]/ {own = ($4 ~ /^Sim\.Simulator/)} /cudasim: VIOLATION/ && !own {n++} END {print n + 0}' "$log")
  if ((n == 0)); then
    verdict=$([ $rc -eq 0 ] && echo "passes (as it must)" || { status=1; echo "FAILS (it must pass)"; })
  else
    verdict=$([ $rc -ne 0 ] && echo "caught" || { status=1; echo "NOT CAUGHT"; })
  fi
  line="mutant $n (${NAMES[$n]}): $verdict; exit $rc; $violations simulator violations; failed tests: ${failed:-none}"
  echo "$line"
  summary+=("$line")
done
meson configure "$BUILD" -Dsim_mutant=0 >/dev/null
echo
printf '%s\n' "${summary[@]}"
echo "logs: $BUILD/mutant-N.log"
exit $status
