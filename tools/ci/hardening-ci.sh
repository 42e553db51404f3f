#!/usr/bin/env bash
# The hardening checks CI runs after the main tests (.ci/run calls it):
#   1. every fuzz target for a short while (tools/ci/fuzz.sh, ZCKPT_CI_FUZZ_SECONDS each, default 30:
#      about two minutes for the four; run them long with tools/ci/fuzz.sh SECONDS);
#   2. every C++ suite under ASan+UBSan (tools/ci/sanitize.sh --asan): the torch-free ones and, when
#      the project's Python has torch, the LibTorch-linked loader suites, in the same clang build
#      as the fuzzers (one build, not two: ASan+UBSan plus libFuzzer's coverage hooks, which are
#      inert outside a fuzzer; configured here with -Dtorch=auto).
# Last line: `N passed, N failed, N skipped`, counting each fuzz target run as one case (failed
# when it crashed or did not run) and each GoogleTest case as one. Exits 1 on any failure.
#
# Environment:
#   ZCKPT_HARDENING_BUILD   build folder (default /tmp/zckpt-hardening-ci; kept, so reruns are
#                           incremental; .ci/run passes <its build>-hardening). Fuzz seeds, corpora
#                           and logs go to <that>-fuzz.
#   ZCKPT_CI_FUZZ_SECONDS   seconds per fuzz target (default 30)
#   ZCKPT_CI_TSAN=1         also run tools/ci/sanitize.sh --tsan in <build>-tsan (a third build, torch-free,
#                           ~2-4 min on 2 cores with its tests; .ci/run sets it)
#   ZCKPT_HARDENING_PT_MB   size of the .pt the SIGKILL test converts (default here 100)
#   ZCKPT_VENV, ZCKPT_JOBS  as for tools/ci/fuzz.sh and tools/ci/sanitize.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${ZCKPT_HARDENING_BUILD:-/tmp/zckpt-hardening-ci}
SECS=${ZCKPT_CI_FUZZ_SECONDS:-30}
export ZCKPT_HARDENING_PT_MB=${ZCKPT_HARDENING_PT_MB:-100}
start=$(date +%s)
passed=0 failed=0 skipped=0

# --- 1. fuzzing ---------------------------------------------------------------------------------
fuzz_log=$(mktemp)
ZCKPT_FUZZ_BUILD=$BUILD ZCKPT_FUZZ_WORK=$BUILD-fuzz ZCKPT_FUZZ_TORCH=auto bash tools/ci/fuzz.sh "$SECS" 2>&1 | tee "$fuzz_log"
n_targets=$(grep -c '^  fuzz_[a-z_]*: ' "$fuzz_log")
n_clean=$(grep -c '^  fuzz_[a-z_]*: .* 0 crash(es)$' "$fuzz_log")
expected=$(bash -c 'source <(sed -n "/^ALL_TARGETS=/p" tools/ci/fuzz.sh); echo ${#ALL_TARGETS[@]}')
passed=$((passed + n_clean))
failed=$((failed + expected - n_clean))  # crashed, or never ran (build failure)
rm -f "$fuzz_log"
echo "[hardening-ci] fuzzing: $n_clean of $expected targets ran clean ($n_targets reported), $(( $(date +%s) - start )) s so far"

# Runs a tools/ci/sanitize.sh mode and adds its `N passed, N failed, N skipped` to the totals (no such
# line: one failure).
sanitize() {
  local log counts p f s
  log=$(mktemp)
  bash tools/ci/sanitize.sh "$@" 2>&1 | tee "$log"
  counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$log" | tail -1)
  rm -f "$log"
  if [ -z "$counts" ]; then failed=$((failed + 1)); return; fi
  read -r p f s < <(sed -E 's/([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1 \2 \3/' <<<"$counts")
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

# --- 2. ASan+UBSan suites -----------------------------------------------------------------------
ZCKPT_ASAN_BUILD=$BUILD sanitize --asan

# --- 3. optional TSan ---------------------------------------------------------------------------
if [ "${ZCKPT_CI_TSAN:-0}" = 1 ]; then
  ZCKPT_TSAN_BUILD=$BUILD-tsan sanitize --tsan
fi

echo "[hardening-ci] $(( $(date +%s) - start )) s in all"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
