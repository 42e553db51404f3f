#!/usr/bin/env bash
# Builds the project under sanitizers and runs its GoogleTest suites.
#
#   tools/ci/sanitize.sh [--asan] [--tsan]       # default: both
#
# ASan+UBSan: every C++ suite: format, pickle, pt, safetensors, convert, merge, hardening, cudasim and, when
#   the project's Python has torch, the LibTorch-linked loader and save suites (-Dtorch=auto -Dpython_module=disabled,
#   -Db_sanitize=address,undefined, clang when present, else gcc). LibTorch itself is not
#   instrumented: our code calling it is, and ASan intercepts every allocation, torch's too.
#   Runs with halt_on_error=1 (any report fails its test) and leak detection on;
#   protect_shadow_gap=0 lets the CUDA driver map memory where ASan would not (a GPU host).
#   The pytest suites (Python + the pybind11 module) are not run under the sanitizers.
# TSan: the same without torch, -Db_sanitize=thread; runs the threaded suites: hardening_pipeline
#   (the loader's torch-free pipeline core: ring, plan, chunk readers, reader threads, CPU copy
#   engine), hardening_concurrency (threads and processes reading while others write),
#   hardening_crash (write errors thrown while the writer's threads run), format_verify and
#   format_unit (parallel verify, the writer's hashing/compression threads), and cudasim_engine
#   (the real CUDA copy engine and pipeline against the simulated asynchronous CUDA runtime of
#   tests/cudasim, whose streams run on threads of their own; built where CUDA headers are).
#   LibTorch is not TSan-instrumented, so the loader's torch-facing files (tensors, loader,
#   load_into, map) and its torch-based suites are not run under TSan.
# Ends with `N passed, N failed, N skipped` over every gtest case run; exits 1 on any failure.
#
# Environment:
#   ZCKPT_ASAN_BUILD  ASan+UBSan build folder (default /tmp/zckpt-asan-build); an existing
#                     folder is reused as configured (tools/ci/hardening-ci.sh passes its fuzz build)
#   ZCKPT_ASAN_TORCH  -Dtorch= of a new ASan+UBSan folder (default auto; disabled: torch-free only)
#   ZCKPT_TSAN_BUILD  TSan build folder (default /tmp/zckpt-tsan-build)
#   ZCKPT_VENV        the project's virtualenv (its torch writes .pt fixtures; default ~/.cache/zckpt/venv)
#   ZCKPT_JOBS        build and test jobs (default 2)
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
ASAN_BUILD=${ZCKPT_ASAN_BUILD:-/tmp/zckpt-asan-build}
TSAN_BUILD=${ZCKPT_TSAN_BUILD:-/tmp/zckpt-tsan-build}
VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
JOBS=${ZCKPT_JOBS:-2}

do_asan=0 do_tsan=0
for a in "$@"; do
  case $a in
    --asan) do_asan=1 ;;
    --tsan) do_tsan=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown argument '$a'" >&2; exit 2 ;;
  esac
done
((do_asan + do_tsan)) || { do_asan=1; do_tsan=1; }

log() { printf '[sanitize] %s\n' "$*" >&2; }

if command -v clang++ >/dev/null; then
  COMPILER=(env CC=clang CXX=clang++)
else
  COMPILER=(env)
fi
COMMON=(-Dpython_module=disabled -Dbuildtype=debugoptimized -Db_lundef=false -Dpython="$VENV/bin/python")

# configure BUILD SANITIZER TORCH: meson setup unless the folder is already configured (from this
# checkout).
configure() {
  local build=$1 sanitizer=$2 torch=$3
  bash "$SRC/tools/build/check-build-dir.sh" "$build" "$SRC" || return 1
  if [ -f "$build/build.ninja" ]; then return 0; fi
  log "configuring $build (-Db_sanitize=$sanitizer -Dtorch=$torch)"
  "${COMPILER[@]}" meson setup "$build" -Db_sanitize="$sanitizer" -Dtorch="$torch" "${COMMON[@]}" >"$build.setup.log" 2>&1 \
    || { cat "$build.setup.log" >&2; return 1; }
}

# Test names (meson's) of the given suites that this build defines.
tests_of() {
  local build=$1; shift
  meson introspect --tests "$build" | python3 -c '
import json, sys
want = set(sys.argv[1:])
for t in json.load(sys.stdin):
    if any(s.split(":")[-1] in want for s in t["suite"]) or t["name"] in want:
        print(t["name"])' "$@"
}

status=0
build_failures=0
junits=()

run_suites() {
  local build=$1 what=$2; shift 2
  mapfile -t names < <(tests_of "$build" "$@")
  if ((${#names[@]} == 0)); then log "$what: no tests to run"; return; fi
  log "$what: ${names[*]}"
  rm -f "$build/meson-logs/testlog.junit.xml"
  python3 "$SRC/tools/ci/gtest_cases.py" remove-stale "$build"  # never read a suite's file of an earlier run
  local rc=0
  meson test -C "$build" --no-rebuild --print-errorlogs --num-processes "$JOBS" --timeout-multiplier 3 "${names[@]}" \
    || { rc=1; status=1; }
  # meson overwrites its log on the next run in the same folder: keep this one.
  if cp "$build/meson-logs/testlog.junit.xml" "$build/meson-logs/$what.junit.xml" 2>/dev/null; then
    junits+=("$build/meson-logs/$what.junit.xml")
    # A suite can fail after every case passed (a sanitizer's report at exit: a leak, a thread
    # never joined): its cases say nothing, so count it as one failure here.
    if ((rc)) && python3 "$SRC/tools/ci/count-tests.py" "$build/meson-logs/$what.junit.xml" >/dev/null; then
      log "$what: a suite failed outside its test cases (sanitizer report at exit?): counted as one failure"
      build_failures=$((build_failures + 1))
    fi
  else
    build_failures=$((build_failures + 1))
  fi
}

build() {
  local dir=$1; shift
  log "building $dir${*:+ ($*)}"
  ninja -C "$dir" -j "$JOBS" "$@" >"$dir.build.log" 2>&1 && return 0
  tail -40 "$dir.build.log" >&2
  log "build of $dir failed (log: $dir.build.log)"
  build_failures=$((build_failures + 1))
  status=1
  return 1
}

if ((do_asan)); then
  if ! configure "$ASAN_BUILD" address,undefined "${ZCKPT_ASAN_TORCH:-auto}"; then
    build_failures=$((build_failures + 1))
    status=1
  elif build "$ASAN_BUILD"; then
    ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1:protect_shadow_gap=0} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
      run_suites "$ASAN_BUILD" asan-ubsan format pickle pt safetensors convert merge hardening loader save cudasim
  fi
fi

if ((do_tsan)); then
  TSAN_TESTS=(hardening_pipeline hardening_concurrency hardening_crash format_verify format_unit cudasim_engine)
  if configure "$TSAN_BUILD" thread disabled; then
    # Only what the threaded suites need (and the zckpt tool they run), not every suite.
    mapfile -t targets < <(meson introspect --targets "$TSAN_BUILD" | python3 -c '
import json, os, sys
build, want = sys.argv[1], set(sys.argv[2:])
for t in json.load(sys.stdin):
    if t["name"] in want:
        print(os.path.relpath(t["filename"][0], build))' "$TSAN_BUILD" "${TSAN_TESTS[@]}" zckpt)
    if build "$TSAN_BUILD" "${targets[@]}"; then
      # The SIGKILL test converts a smaller .pt under TSan (the instrumented tool is ~10x slower).
      ZCKPT_HARDENING_PT_MB=${ZCKPT_HARDENING_PT_MB:-50} \
      TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
        run_suites "$TSAN_BUILD" tsan "${TSAN_TESTS[@]}"
    fi
  else
    build_failures=$((build_failures + 1))
    status=1
  fi
fi

# `N passed, N failed, N skipped` over every case, a failed build counting as one failed case.
counts=$( ((${#junits[@]})) && python3 "$SRC/tools/ci/count-tests.py" "${junits[@]}" | tail -1)
read -r passed failed skipped < <(sed -E 's/([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1 \2 \3/' <<<"${counts:-0 passed, 0 failed, 0 skipped}")
failed=$((failed + build_failures))
((failed)) && status=1
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
