#!/usr/bin/env bash
# The training frameworks' own save and resume calls with zckpt plugged in (docs/integrations.md):
# one cached virtualenv per framework under ZCKPT_FRAMEWORKS_CACHE (~/.cache/zckpt/frameworks),
# made once with the project virtualenv's Python and seeing its torch through a .pth file (no torch
# download), the framework pinned from PyPI (FRAMEWORKS below); a half-made one is made again.
# Each runs its tests/frameworks/test_<name>.py on the CPU with that virtualenv's Python, the
# package from the build folder (ZCKPT_BUILD, default build/) on PYTHONPATH and its zckpt binary
# as ZCKPT_BIN. Ends with `N passed, N failed, N skipped` (tools/ci/count-tests.py over pytest's
# JUnit files; a virtualenv that cannot be made is one failure).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
PROJECT_VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
CACHE=${ZCKPT_FRAMEWORKS_CACHE:-$HOME/.cache/zckpt/frameworks}
BUILD=$(realpath -m "${ZCKPT_BUILD:-build}")  # relative (to the checkout) or absolute
# name -> the pinned packages of its virtualenv (the versions docs/integrations.md says are tested).
declare -A FRAMEWORKS=(
  [lightning]="lightning==2.6.6"
  [transformers]="transformers==5.25.0 accelerate==1.16.0"
  [trl]="trl==1.16.0 transformers==5.25.0 accelerate==1.16.0"
  [accelerate]="accelerate==1.16.0"
  [verl]="verl==0.9.1"
  [deepspeed]="deepspeed==0.19.8"
  [torchtitan]="torchtitan==0.3.0"
)
# The tests each virtualenv runs: test_<name>.py of tests/frameworks/.
ORDER=(lightning transformers trl accelerate verl deepspeed torchtitan)
# DeepSpeed's ops are built when first used (its CPU communication op), not at install.
export DS_BUILD_OPS=0 DS_ACCELERATOR=cpu
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-frameworks.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
failed_venvs=0

log() { printf '[frameworks] %s\n' "$*"; }

# venv NAME PACKAGES...: the cached virtualenv NAME (made when missing or half made); prints its path.
venv() {
  local name=$1 dir=$CACHE/$1 base site
  shift
  if [ ! -f "$dir/.complete" ] || [ "$(cat "$dir/.complete")" != "$*" ]; then
    log "making $dir (pip install $*)" >&2
    rm -rf "$dir"
    mkdir -p "$CACHE"
    base=$("$PROJECT_VENV/bin/python" -c 'import sys; print(sys._base_executable)') || return 1
    "$base" -m venv "$dir" >&2 || return 1
    site=$("$PROJECT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
    echo "$site" >"$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/project_venv.pth"
    "$dir/bin/pip" install -q --disable-pip-version-check "$@" >&2 || return 1
    echo "$*" >"$dir/.complete"
  fi
  echo "$dir"
}

if [ ! -x "$BUILD/tools/zckpt" ] || [ ! -f "$BUILD/src/python/zckpt/libzckpt_core.so" ] || [ ! -x "$PROJECT_VENV/bin/python" ]; then
  log "no build in $BUILD or no project virtualenv at $PROJECT_VENV (run tools/setup.sh first)"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
for name in "${ORDER[@]}"; do
  t0=$(date +%s)
  # shellcheck disable=SC2086 # the package list splits into words on purpose
  if ! dir=$(venv "$name" ${FRAMEWORKS[$name]}); then
    log "FAIL $name: its virtualenv could not be made"
    failed_venvs=$((failed_venvs + 1))
    continue
  fi
  tests=("$ROOT/tests/frameworks/test_$name.py")
  # verl also drives `zckpt reshard` / `merge` and transformers' from_pretrained through
  # tools/examples/verl_reshard_check.py (a test of the main suite, skipped there without verl).
  [ "$name" = verl ] && tests+=("$ROOT/tests/python/test_verl_reshard_real.py")
  env PYTHONPATH="$BUILD/src/python" ZCKPT_BIN="$BUILD/tools/zckpt" ZCKPT_BUILD_ROOT="$BUILD" ZCKPT_VERL_PYTHON="$dir/bin/python" \
    "$dir/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$WORK/$name.xml" "${tests[@]}" \
    2>&1 | sed "s/^/[frameworks] $name: /"
  log "$name: $(($(date +%s) - t0)) s"
done
log "all $(($(date +%s) - start)) s"
counts=$(python3 "$ROOT/tools/ci/count-tests.py" "$WORK"/*.xml 2>/dev/null || true)
read -r p _ f _ s _ <<<"${counts:-0 passed, 0 failed, 0 skipped}"
f=$((f + failed_venvs))
echo "$p passed, $f failed, $s skipped"
[ "$f" -eq 0 ]
