#!/usr/bin/env bash
# The torch-version matrix, fed the manylinux wheel: tools/build-wheel.sh builds it once (cached
# toolchain and static libraries under ~/.cache/zckpt/wheel), its ELF files are checked to need
# glibc's libraries only, then it is installed with `pip install --only-binary :all: --no-index`
# and no compiler reachable (PATH holding the virtualenv's bin/ alone, CC and CXX a program that
# fails) into a fresh virtualenv per case, each seeing a cached torch through a .pth file:
#   - torch ZCKPT_MATRIX_TORCHES (default 2.4.1, the oldest supported, and 2.9.1, a middle one),
#     each from PyPI (or a wheel already in ZCKPT_MATRIX_WHEELS, ~/.cache/zckpt/wheels) into a
#     virtualenv of its own made with /usr/bin/python3, cached under ZCKPT_MATRIX_CACHE
#     (~/.cache/zckpt/torch-matrix; ~5-7 GB each, made once: a half-made one is made again);
#   - the project virtualenv's torch (the newest on PyPI when setup.sh made it; printed below);
#   - no torch at all;
#   - no torch under another Python: Debian's PyPy 3.9 (the wheel is py3-none).
# Under each torch: tools/ci/torch_matrix_checks.py torch (convert, verify, load == torch.load
# with views and shared storages, load_into in place, iter_tensors, save + export read back by
# torch.load, the vLLM entry point, `import zckpt` in under a second without torch, zckpt._C never
# imported). Without torch: the command's convert, verify, ls --json, export, load and merge of a
# DCP folder, `import zckpt`, zckpt.load saying torch is needed; their outputs read back under
# torch (both under CPython and under PyPy). Each check counts; ends with `N passed, N failed, N skipped` (.ci/run adds it up).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
PROJECT_VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
CACHE=${ZCKPT_MATRIX_CACHE:-$HOME/.cache/zckpt/torch-matrix}
TORCHES=${ZCKPT_MATRIX_TORCHES:-2.4.1 2.9.1}
CHECKS=$PWD/tools/ci/torch_matrix_checks.py
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-torch-matrix.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset LD_LIBRARY_PATH MESON_DEVENV ZCKPT_BIN PYTHONPATH ZCKPT_CLI_DIR
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

source tools/ci/wheel-checks.sh

# The wheel, built once for /usr/bin/python3 (the Python of every virtualenv below).
build_wheel() {
  bash tools/build-wheel.sh --python /usr/bin/python3 --out "$WORK/dist" || return 1
  WHEEL=$(ls "$WORK"/dist/zckpt-*-manylinux_2_28_x86_64.whl) || return 1
  check_wheel "$WHEEL" x86_64 "$WORK/unpacked"
}
count wheel build_wheel
WHEEL=$(ls "$WORK"/dist/zckpt-*-manylinux_2_28_x86_64.whl 2>/dev/null | head -n1)

# fresh NAME [SITE]: a new virtualenv in $WORK that sees SITE (a cached torch) through a .pth file,
# with the wheel installed by pip from the file alone, no compiler reachable; prints its path.
fresh() {
  local dir=$WORK/venv-$1 site=${2:-}
  "${FRESH_PYTHON:-/usr/bin/python3}" -m venv "$dir" >&2 || return 1
  if [ -n "$site" ]; then
    echo "$site" >"$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/cached_torch.pth"
  fi
  [ -n "$WHEEL" ] || { echo "no wheel to install" >&2; return 1; }
  env PATH="$dir/bin" CC=/bin/false CXX=/bin/false \
    "$dir/bin/pip" install -q --disable-pip-version-check --only-binary :all: --no-index "$WHEEL" >&2 || return 1
  echo "$dir"
}
site_of() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# A torch wheel downloaded before (ZCKPT_MATRIX_WHEELS, default ~/.cache/zckpt/wheels, which holds
# 2.4.1's here) is installed from its file: with --find-links pip would still take the same
# wheel from PyPI, the index coming first among equal candidates.
WHEEL_DIR=${ZCKPT_MATRIX_WHEELS:-$HOME/.cache/zckpt/wheels}
PYTAG=$(/usr/bin/python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
for v in $TORCHES; do
  spec=torch==$v
  for w in "$WHEEL_DIR/torch-$v-$PYTAG-$PYTAG"-*linux*_"$(uname -m)".whl; do [ -f "$w" ] && spec=$w; done
  if cached=$(venv "torch-$v" "$spec" numpy) && dir=$(fresh "torch-$v" "$(site_of "$cached")"); then
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
if dir=$(fresh project "$(site_of "$PROJECT_VENV")"); then
  count "torch-${newest%%+*}" "$dir/bin/python" "$CHECKS" torch "$WORK/project"
else
  failed=$((failed + 1))
  log "FAIL torch-${newest%%+*}: the wheel could not be installed"
fi

mkdir -p "$WORK/no-torch"
project=$WORK/venv-project/bin/python
count inputs "$project" "$CHECKS" inputs "$WORK/no-torch"
if dir=$(fresh no-torch); then
  count no-torch "$dir/bin/python" "$CHECKS" no-torch "$WORK/no-torch"
  count no-torch-outputs "$project" "$CHECKS" outputs "$WORK/no-torch"
else
  failed=$((failed + 1))
  log "FAIL no-torch: its virtualenv could not be made"
fi

# A C program outside the tree, as a C user of the wheel builds one: tests/capi/zckpt_c_test.c
# compiled against the header pip installed (SITE/zckpt/include) and linked to the wheel's
# libzckpt_core.so, then run; each of its `ok`/`FAIL` lines is a check.
c_program() {
  local site zdir
  site=$(site_of "$WORK/venv-no-torch") && zdir=$site/zckpt || return 1
  cc -std=c11 -Wall -Wextra -Werror -I"$zdir/include" tests/capi/zckpt_c_test.c -o "$WORK/zckpt_c_test" \
    -L"$zdir" -lzckpt_core -Wl,-rpath,"$zdir" >&2 || return 1
  mkdir -p "$WORK/c-program" && "$WORK/zckpt_c_test" "$WORK/c-program"
}
if [ -d "$WORK/venv-no-torch" ]; then
  count c-program c_program
fi

# Another Python: the wheel is py3-none (its native code a C ABI loaded with ctypes, no extension
# module), so any Python 3 from 3.9 installs it. The other Python 3 this Debian has is PyPy 3.9
# (installed here when missing, as root): another version and another implementation, no torch.
PYPY=$(command -v pypy3 || true)
if [ -z "$PYPY" ] && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq pypy3 pypy3-venv >/dev/null 2>&1 && PYPY=$(command -v pypy3 || true)
fi
if [ -n "$PYPY" ]; then
  mkdir -p "$WORK/pypy"
  count inputs-pypy "$project" "$CHECKS" inputs "$WORK/pypy"
  if dir=$(FRESH_PYTHON=$PYPY fresh pypy); then
    count "pypy-$("$PYPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" "$dir/bin/python" "$CHECKS" no-torch "$WORK/pypy"
    count pypy-outputs "$project" "$CHECKS" outputs "$WORK/pypy"
  else
    failed=$((failed + 1))
    log "FAIL pypy: the wheel could not be installed under $PYPY"
  fi
else
  failed=$((failed + 1))
  log "FAIL pypy: no pypy3 (Debian: apt-get install pypy3 pypy3-venv)"
fi

log "all $(($(date +%s) - start)) s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
