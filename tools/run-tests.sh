#!/usr/bin/env bash
# Sets up (tools/setup.sh), builds, and runs every test: the GoogleTest suites through
# `meson test`, then the Python suites with pytest. Ends with `N passed, N failed, N skipped`
# counting every test case of both (a GoogleTest suite whose cases meson's log lost counts as
# failed: tools/ci/count-tests.py --meson-log); exits non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${ZCKPT_BUILD:-build}
BUILD_ABS=$(realpath -m "$BUILD")  # ZCKPT_BUILD may be relative (to the checkout) or absolute
VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}

bash tools/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

status=0
rm -f "$BUILD/meson-logs/testlog.junit.xml" "$BUILD/pytest.junit.xml"
# meson reads each gtest suite's NAME.xml after the suite ends, whoever wrote it: one left by an
# earlier run would stand in for a suite that wrote none this time (killed by its timeout, crashed).
python3 tools/ci/gtest_cases.py remove-stale "$BUILD" || status=1
meson test -C "$BUILD" --print-errorlogs --num-processes "$(nproc)" || status=1

junits=()
if ls tests/*/test_*.py >/dev/null 2>&1; then
  # The module and the zckpt binary come from the build folder (what `meson devenv` sets up).
  ZCKPT_BIN="$BUILD_ABS/tools/zckpt" ZCKPT_BUILD_ROOT="$BUILD_ABS" meson devenv -C "$BUILD" \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$PWD/tests" --junitxml="$BUILD_ABS/pytest.junit.xml"
  rc=$?
  # pytest exits 5 when it collected nothing: not a failure of the suite.
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then status=1; fi
  junits+=("$BUILD/pytest.junit.xml")
fi

# meson's log is also held against the build: each gtest suite's cases there must be the cases its
# executable lists, else the suite is named and counted as failed (tools/ci/gtest_cases.py).
python3 tools/ci/count-tests.py --meson-log "$BUILD" "$BUILD/meson-logs/testlog.junit.xml" "${junits[@]}" || status=1
exit $status
