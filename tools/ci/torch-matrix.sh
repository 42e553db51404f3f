#!/usr/bin/env bash
# The torch-version matrix: one build of zckpt, used unchanged under several torch 2.x and with no
# torch at all. The build folder's Python package (`_core`, the pure-Python modules; the tests'
# `_C` there is never imported by the checks) and its zckpt binary are put on PYTHONPATH /
# ZCKPT_CLI_DIR of each virtualenv:
#   - torch ZCKPT_MATRIX_TORCHES (default 2.4.1, the oldest supported, and 2.9.1, a middle one),
#     each from PyPI (or a wheel already in ZCKPT_MATRIX_WHEELS, ~/.cache/zckpt/wheels) into a
#     virtualenv of its own made with /usr/bin/python3, cached under ZCKPT_MATRIX_CACHE
#     (~/.cache/zckpt/torch-matrix; ~5-7 GB each, made once: a half-made one is made again);
#   - the project virtualenv's torch (the newest on PyPI when setup.sh made it; printed below);
#   - a virtualenv without torch.
# Under each torch: tools/ci/torch_matrix_checks.py torch (convert, verify, load == torch.load
# with views and shared storages, load_into in place, iter_tensors, save + export read back by
# torch.load, the vLLM entry point, `import zckpt` in under a second without torch, zckpt._C never
# imported). Without torch: the command's convert, verify, ls --json, export, load and merge of a DCP
# folder, `import zckpt`, zckpt.load saying torch is needed; their outputs read back under torch.
# Each check counts; ends with `N passed, N failed, N skipped` (.ci/run adds it up).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=${ZCKPT_BUILD:-build}
BUILD_ABS=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "[torch-matrix] no build folder $BUILD (tools/run-tests.sh makes it)"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
if ! ls "$BUILD_ABS"/src/python/zckpt/_core.*.so >/dev/null 2>&1; then
  echo "[torch-matrix] $BUILD has no Python package (src/python/zckpt/_core.*.so): was it configured without torch?"
  echo "0 passed, 1 failed, 0 skipped"; exit 1
fi
PROJECT_VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
CACHE=${ZCKPT_MATRIX_CACHE:-$HOME/.cache/zckpt/torch-matrix}
TORCHES=${ZCKPT_MATRIX_TORCHES:-2.4.1 2.9.1}
CHECKS=$PWD/tools/ci/torch_matrix_checks.py
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-torch-matrix.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset LD_LIBRARY_PATH MESON_DEVENV ZCKPT_BIN
export PYTHONPATH=$BUILD_ABS/src/python ZCKPT_CLI_DIR=$BUILD_ABS/tools
passed=0 failed=0 skipped=0
start=$(date +%s)

log() { printf '[torch-matrix] %s\n' "$*"; }

# count NAME COMMAND...: runs one checks mode; each `ok X` / `FAIL X: why` line is one check.
count() {
  local name=$1 out rc t0
  shift
  t0=$(date +%s)
  out=$("$@" 2>"$WORK/$name.err")
  rc=$?
  local p f
  p=$(grep -c '^ok ' <<<"$out")
  f=$(grep -c '^FAIL ' <<<"$out")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1
    out+=$'\n'"FAIL $name: exit $rc: $(tail -n 5 "$WORK/$name.err" | tr '\n' ' ')"
  fi
  passed=$((passed + p)) failed=$((failed + f))
  sed "s/^/[torch-matrix] $name: /" <<<"$out"
  log "$name: $p passed, $f failed ($(($(date +%s) - t0)) s)"
}

# venv NAME PIP_ARGS...: the cached virtualenv NAME (made with PIP_ARGS when missing); prints its path.
venv() {
  local name=$1 dir=$CACHE/$1
  shift
  if [ ! -f "$dir/.complete" ]; then
    log "making $dir (${*:+pip install }${*:-nothing to install})" >&2
    rm -rf "$dir"
    mkdir -p "$CACHE"
    /usr/bin/python3 -m venv "$dir" >&2 || return 1
    if [ $# -gt 0 ]; then "$dir/bin/pip" install -q --disable-pip-version-check "$@" >&2 || return 1; fi
    touch "$dir/.complete"
  fi
  echo "$dir"
}

# A torch wheel downloaded before (ZCKPT_MATRIX_WHEELS, default ~/.cache/zckpt/wheels, which holds
# 2.4.1's here) is installed from its file: with --find-links pip would still take the same
# wheel from PyPI, the index coming first among equal candidates.
WHEEL_DIR=${ZCKPT_MATRIX_WHEELS:-$HOME/.cache/zckpt/wheels}
PYTAG=$(/usr/bin/python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
for v in $TORCHES; do
  spec=torch==$v
  for w in "$WHEEL_DIR/torch-$v-$PYTAG-$PYTAG"-*linux*_"$(uname -m)".whl; do [ -f "$w" ] && spec=$w; done
  if dir=$(venv "torch-$v" "$spec" numpy); then
    mkdir -p "$WORK/torch-$v"
    count "torch-$v" "$dir/bin/python" "$CHECKS" torch "$WORK/torch-$v"
  else
    failed=$((failed + 1))
    log "FAIL torch-$v: its virtualenv could not be made"
  fi
done

newest=$("$PROJECT_VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)
log "the project virtualenv's torch: ${newest:-none}"
mkdir -p "$WORK/project"
count "torch-${newest%%+*}" "$PROJECT_VENV/bin/python" "$CHECKS" torch "$WORK/project"

mkdir -p "$WORK/no-torch"
count inputs "$PROJECT_VENV/bin/python" "$CHECKS" inputs "$WORK/no-torch"
if dir=$(venv no-torch); then
  count no-torch "$dir/bin/python" "$CHECKS" no-torch "$WORK/no-torch"
  count no-torch-outputs "$PROJECT_VENV/bin/python" "$CHECKS" outputs "$WORK/no-torch"
else
  failed=$((failed + 1))
  log "FAIL no-torch: its virtualenv could not be made"
fi

log "all $(($(date +%s) - start)) s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
