#!/usr/bin/env bash
# The wheels on the systems they claim, each in a Debian root file system of its own (as root:
# debootstrap, chroot, mounts):
#
#   tools/ci/platforms.sh [--full] [--wheels DIR] [--cached-only]
#
#   - bullseye-amd64: CPython 3.9 on glibc 2.31 (older than this machine's 2.36), x86_64 wheel;
#   - trixie-amd64:   CPython 3.13 on glibc 2.41, x86_64 wheel;
#   - bookworm-arm64: CPython 3.11 on aarch64, under qemu-user through binfmt_misc, the aarch64
#     wheel (cross-built here: tools/build-wheel.sh --arch aarch64), with PyPI's aarch64 torch
#     (ARM_TORCH below) and without torch.
# CPython 3.11 and PyPy 3.9 on this machine are tools/ci/torch-matrix.sh's. PyPI's x86_64 torch
# pulls ~3 GB of CUDA packages (nvidia-*), so the x86_64 roots check the wheel without torch:
# their no-torch run's outputs are read back by torch on this machine.
#
# Each root gets the wheel with pip from the file alone (--only-binary :all: --no-index), no
# compiler in it (debootstrap's minbase has none; CC and CXX fail), into a fresh virtualenv; a
# torch virtualenv inside the root is cached and seen through a .pth file, as torch-matrix.sh does.
# The checks are tools/ci/torch_matrix_checks.py's (torch: convert, verify, load == torch.load,
# load_into in place, iter_tensors, save + export, DCP, the vLLM entry point; no-torch: the
# command's convert, verify, ls, export, load, merge, the torch-free API), and `zckpt bench
# verify`'s XXH3 kernel: neon on aarch64, what CPUID allows on x86_64.
#
# Both wheels are built (tools/build-wheel.sh) unless --wheels names a folder holding them.
# Default (CI): every root's no-torch checks and kernel, and the emulated torch checks. --full
# adds `zckpt bench verify` on BENCH_MB of data under emulation (its GB/s is qemu's, printed
# labelled as emulated: no performance claim). Ends with `N passed, N failed, N skipped`.
#
# --cached-only (what .ci/run passes): runs only where the roots, arm64's torch and the aarch64
# wheel's static libraries are already made on this machine (made once, ~75 min cold: more than
# CI's budget), else counts one skip naming what is missing and how to make it.
#
# Cached under ZCKPT_PLATFORMS_CACHE (~/.cache/zckpt/roots): the roots (~0.3 GB each; ~0.9 GB
# for arm64's with torch), made once (a half-made one is made again); the wheels' toolchain and
# libraries under ~/.cache/zckpt/wheel (tools/build-wheel.sh). Needs debootstrap,
# qemu-user-static and binfmt-support (installed when missing) and binfmt_misc (mounted when not).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
SRC=$PWD
CACHE=${ZCKPT_PLATFORMS_CACHE:-$HOME/.cache/zckpt/roots}
MIRROR=${ZCKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The newest torch PyPI serves for aarch64 without CUDA: from 2.10 on its wheels require CUDA 13
# packages on every Linux, before it only on x86_64.
ARM_TORCH=2.9.1
# Data `zckpt bench verify` hashes under emulation with --full (MB): enough for a steady rate.
BENCH_MB=64
# `import zckpt` under qemu: every instruction emulated, a native second becomes several.
EMULATED_IMPORT_SECONDS=15
CHECKS=$SRC/tools/ci/torch_matrix_checks.py
FULL=0
WHEELS=
CACHED_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --full) FULL=1; shift ;;
    --cached-only) CACHED_ONLY=1; shift ;;
    --wheels) WHEELS=$(realpath "$2"); shift 2 ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
done
if [ "$CACHED_ONLY" -eq 1 ]; then
  missing=()
  for made in bullseye-amd64/.complete trixie-amd64/.complete bookworm-arm64/.complete \
              "bookworm-arm64/opt/torch-$ARM_TORCH/.complete"; do
    [ -f "$CACHE/$made" ] || missing+=("$CACHE/$made")
  done
  [ -f "${ZCKPT_WHEEL_CACHE:-$HOME/.cache/zckpt/wheel}/deps-aarch64-linux-gnu.2.28/.ready" ] ||
    missing+=("the aarch64 wheel's static libraries")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[platforms] skipped: not made on this machine yet (${missing[*]}); run tools/ci/platforms.sh once (~75 min cold)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
  fi
fi
[ "$(id -u)" -eq 0 ] || { echo "platforms: needs root (debootstrap, chroot, mount)"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-platforms.XXXXXX")
unset LD_LIBRARY_PATH MESON_DEVENV ZCKPT_BIN PYTHONPATH ZCKPT_CLI_DIR
passed=0 failed=0 skipped=0
start=$(date +%s)
log() { printf '[platforms] %s\n' "$*"; }
source tools/ci/wheel-checks.sh

# count NAME COMMAND...: runs one set of checks; each `ok X` / `FAIL X: why` / `skip X: why` line
# is one check (as torch-matrix.sh counts them).
count() {
  local name=$1 out rc t0 p f s
  shift
  t0=$(date +%s)
  out=$("$@" 2>"$WORK/$name.err")
  rc=$?
  p=$(grep -c '^ok ' <<<"$out")
  f=$(grep -c '^FAIL ' <<<"$out")
  s=$(grep -c '^skip ' <<<"$out")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1
    out+=$'\n'"FAIL $name: exit $rc: $(tail -n 5 "$WORK/$name.err" | tr '\n' ' ')"
  fi
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  sed "s/^/[platforms] $name: /" <<<"$out"
  log "$name: $p passed, $f failed, $s skipped ($(($(date +%s) - t0)) s)"
}

# --- mounts: every one made is undone on exit, innermost first ----------------------------------
MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -R "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}"; done
  rm -rf "$WORK"
}
trap cleanup EXIT
mounted_under() { awk -v r="$1" '$2 == r || index($2, r "/") == 1' /proc/mounts; }
# enter ROOT: /proc, /sys (torch's cpuinfo reads the CPU lists there), /dev, the checkout
# (read-only) and $WORK at their paths on this machine.
enter() {
  local r=$1
  mkdir -p "$r$SRC" "$r$WORK"
  mount -t proc proc "$r/proc" && MOUNTS+=("$r/proc")
  mount -t sysfs -o ro sysfs "$r/sys" && MOUNTS+=("$r/sys")
  mount --rbind /dev "$r/dev" && mount --make-rslave "$r/dev" && MOUNTS+=("$r/dev")
  mount --bind "$SRC" "$r$SRC" && mount -o remount,bind,ro "$r$SRC" && MOUNTS+=("$r$SRC")
  mount --bind "$WORK" "$r$WORK" && MOUNTS+=("$r$WORK")
}
# in_root ROOT COMMAND...: COMMAND in ROOT with a clean environment, no compiler reachable.
in_root() {
  local r=$1
  shift
  chroot "$r" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 CC=/bin/false CXX=/bin/false \
    ZCKPT_CHECKS_IMPORT_SECONDS="${IMPORT_SECONDS:-1.0}" "$@"
}

# --- the roots -----------------------------------------------------------------------------------
need_tools() {
  local missing=()
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  [ -e /usr/bin/qemu-aarch64-static ] || missing+=(qemu-user-static)
  command -v update-binfmts >/dev/null || missing+=(binfmt-support)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get install -y -qq "${missing[@]}" >/dev/null || return 1
  fi
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc ||
    { echo "binfmt_misc cannot be mounted here: no aarch64 emulation" >&2; return 1; }
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  [ "$(head -n1 /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null)" = enabled ] ||
    { echo "binfmt_misc has no enabled qemu-aarch64 entry (update-binfmts --enable qemu-aarch64)" >&2; return 1; }
  echo "ok aarch64_emulation $(sed -n 's/^interpreter //p' /proc/sys/fs/binfmt_misc/qemu-aarch64)"
}
# root NAME SUITE ARCH: the cached root file system ($CACHE/NAME); prints its path.
root() {
  local name=$1 suite=$2 arch=$3 dir=$CACHE/$1
  if [ ! -f "$dir/.complete" ]; then
    # Never delete through a mount: a bind of /dev or the checkout would go with it.
    [ -z "$(mounted_under "$dir")" ] || { echo "$dir has mounts under it; unmount them first" >&2; return 1; }
    log "making $dir: debootstrap $suite ($arch)" >&2
    rm -rf "$dir" && mkdir -p "$CACHE"
    debootstrap --variant=minbase --arch "$arch" --include=python3,python3-venv,ca-certificates \
      "$suite" "$dir" "$MIRROR" >"$CACHE/$name.debootstrap.log" 2>&1 ||
      { echo "debootstrap $suite $arch failed: $CACHE/$name.debootstrap.log" >&2; return 1; }
    touch "$dir/.complete"
  fi
  echo "$dir"
}
# torch_venv ROOT VERSION: a virtualenv inside ROOT with PyPI's torch VERSION (made once); prints
# its path inside the root. This machine's pip downloads the wheels for the root's platform (pip
# download --platform reads requirement markers against this machine, so torch's own are
# evaluated for the root by torch_requirements below); the root's pip installs them with no index:
# nothing inside a root reaches the network.
torch_venv() {
  local r=$1 v=$2 dir=/opt/torch-$2 tag plat got=()
  if [ ! -f "$r$dir/.complete" ]; then
    log "making $r$dir: torch==$v from PyPI" >&2
    rm -rf "${r:?}$dir" "$r/opt/wheels" && mkdir -p "$r/opt/wheels"
    tag=$(in_root "$r" python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')
    plat=$(in_root "$r" uname -m)
    got=(-q --disable-pip-version-check --only-binary :all: --platform "manylinux_2_28_$plat" --platform "manylinux2014_$plat"
         --python-version "$tag" -d "$r/opt/wheels")
    /usr/bin/python3 -m pip download "${got[@]}" --no-deps "torch==$v" >&2 &&
      mapfile -t reqs < <(/usr/bin/python3 "$SRC/tools/ci/wheel_requirements.py" "$r"/opt/wheels/torch-*.whl "$tag" "$plat") &&
      /usr/bin/python3 -m pip download "${got[@]}" "${reqs[@]}" >&2 &&
      in_root "$r" python3 -m venv "$dir" >&2 &&
      in_root "$r" "$dir/bin/pip" install -q --disable-pip-version-check --only-binary :all: --no-index \
        --find-links /opt/wheels "torch==$v" >&2 || return 1
    rm -rf "$r/opt/wheels"
    touch "$r$dir/.complete"
  fi
  echo "$dir"
}
# installer ROOT: a pip inside ROOT (prints its path) that installs into another virtualenv
# (pip --python, pip 22.3+), made once: a virtualenv's own ensurepip takes ~2 min under
# emulation. Nothing where the root's pip is older (Debian 11's 20.3): its virtualenvs get their own.
installer() {
  local r=$1 dir=/opt/pip
  if [ ! -f "$r$dir/.complete" ]; then
    rm -rf "${r:?}$dir"
    in_root "$r" python3 -m venv "$dir" >&2 || return 1
    touch "$r$dir/.complete"
  fi
  in_root "$r" "$dir/bin/python" -c 'import pip, sys; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 3))' &&
    echo "$dir/bin/pip"
}
# fresh ROOT NAME [TORCH_VENV]: a new virtualenv in $WORK (seen at the same path inside ROOT) with
# the wheel for ROOT's architecture installed from its file alone, no compiler reachable; sees
# TORCH_VENV's packages through a .pth file. Prints its path.
fresh() {
  local r=$1 dir=$WORK/venv-$2 torch=${3:-} arch whl site pip
  arch=$(in_root "$r" uname -m)
  whl=$(ls "$WORK"/dist/zckpt-*-manylinux_2_28_"$arch".whl 2>/dev/null | head -n1)
  [ -n "$whl" ] || { echo "no $arch wheel to install" >&2; return 1; }
  if pip=$(installer "$r"); then
    in_root "$r" python3 -m venv --without-pip "$dir" >&2 || return 1
    pip="$pip --python $dir/bin/python"
  else
    in_root "$r" python3 -m venv "$dir" >&2 || return 1
    pip=$dir/bin/pip
  fi
  site=$(in_root "$r" "$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [ -n "$torch" ]; then
    in_root "$r" "$torch/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$r$site/cached_torch.pth"
  fi
  # shellcheck disable=SC2086  # $pip is a command and its options
  in_root "$r" $pip install -q --disable-pip-version-check --only-binary :all: --no-index "$whl" >&2 || return 1
  echo "$dir"
}
# kernel ROOT VENV FILE: `zckpt bench verify` names the XXH3 kernel xxHash runs on that machine:
# neon on aarch64; on x86_64 the widest of AVX-512F, AVX2 that /proc/cpuinfo lists (the kernel
# lists them only when it saves their registers), else sse2.
kernel() {
  local got want
  case $(in_root "$1" uname -m) in
    aarch64) want=neon ;;
    *) case " $(grep -m1 '^flags' /proc/cpuinfo) " in *" avx512f "*) want=avx512 ;; *" avx2 "*) want=avx2 ;; *) want=sse2 ;; esac ;;
  esac
  got=$(in_root "$1" "$2/bin/python" -m zckpt bench verify "$3" --rounds 1 --json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["xxh3_kernel"])') || { echo "FAIL xxh3_kernel: bench verify failed"; return; }
  [ "$got" = "$want" ] && echo "ok xxh3_kernel $got" || echo "FAIL xxh3_kernel: $got where the CPU has $want"
}

# --- the wheels ----------------------------------------------------------------------------------
wheels() {
  local arch whl
  mkdir -p "$WORK/dist"
  for arch in x86_64 aarch64; do
    local t0=$(date +%s)
    if [ -n "$WHEELS" ]; then
      cp "$WHEELS"/zckpt-*-manylinux_2_28_"$arch".whl "$WORK/dist/" || echo "FAIL wheel_$arch: none in $WHEELS"
    else
      bash tools/build-wheel.sh --arch "$arch" --python /usr/bin/python3 --out "$WORK/dist" >"$WORK/build-$arch.log" 2>&1 ||
        { echo "FAIL wheel_build_$arch: $(tail -n 5 "$WORK/build-$arch.log" | tr '\n' ' ')"; continue; }
      echo "# $arch wheel built in $(($(date +%s) - t0)) s"
    fi
    whl=$(ls "$WORK"/dist/zckpt-*-manylinux_2_28_"$arch".whl) || continue
    check_wheel "$whl" "$arch" "$WORK/unpacked-$arch"
  done
}
count wheels wheels
count tools need_tools

# The host's Python with torch (the project virtualenv's, as torch-matrix.sh's "project" case)
# writes what the no-torch runs read and reads back what they write.
host=$WORK/venv-host
/usr/bin/python3 -m venv "$host" &&
  "$host/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >/dev/null &&
  echo "$(${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >"$("$host/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/cached_torch.pth" &&
  "$host/bin/pip" install -q --disable-pip-version-check --only-binary :all: --no-index "$WORK"/dist/zckpt-*-manylinux_2_28_x86_64.whl ||
  { failed=$((failed + 1)); log "FAIL host: the wheel could not be installed with the project's torch"; }

# system NAME SUITE ARCH [TORCH]: one root's checks.
system() {
  local name=$1 suite=$2 arch=$3 torch=${4:-} r tv dir py
  if ! r=$(root "$name" "$suite" "$arch"); then failed=$((failed + 1)); log "FAIL $name: no root"; return; fi
  enter "$r"
  py=$(in_root "$r" python3 -c 'import platform; print(platform.python_implementation(), platform.python_version(), "glibc", platform.libc_ver()[1], platform.machine())')
  log "$name: $py"
  mkdir -p "$WORK/$name"
  count "$name-inputs" "$host/bin/python" "$CHECKS" inputs "$WORK/$name"
  if dir=$(fresh "$r" "$name-no-torch"); then
    count "$name-no-torch" in_root "$r" "$dir/bin/python" "$CHECKS" no-torch "$WORK/$name"
    count "$name-outputs" "$host/bin/python" "$CHECKS" outputs "$WORK/$name"
    count "$name-kernel" kernel "$r" "$dir" "$WORK/$name/m.zckpt"
  else
    failed=$((failed + 1)); log "FAIL $name-no-torch: the wheel could not be installed"
  fi
  if [ -n "$torch" ]; then
    mkdir -p "$WORK/$name-torch"
    if tv=$(torch_venv "$r" "$torch") && dir=$(fresh "$r" "$name-torch" "$tv"); then
      count "$name-torch-$torch" in_root "$r" "$dir/bin/python" "$CHECKS" torch "$WORK/$name-torch"
    else
      failed=$((failed + 1)); log "FAIL $name-torch-$torch: its virtualenv could not be made"
    fi
  else
    count "$name-torch" echo "skip $name-torch: PyPI's x86_64 torch pulls ~3 GB of CUDA packages; the no-torch run's outputs are read back by torch on this machine"
  fi
  if [ "$FULL" = 1 ] && [ "$arch" = arm64 ]; then
    "$host/bin/python" -c "import sys, torch, zckpt; zckpt.save({'x': torch.randn($BENCH_MB * 2**18)}, sys.argv[1])" "$WORK/$name/bench.zckpt"
    log "$name: zckpt bench verify, $BENCH_MB MB, EMULATED by qemu (not a performance figure):"
    in_root "$r" "$WORK/venv-$name-no-torch/bin/python" -m zckpt bench verify "$WORK/$name/bench.zckpt" --rounds 3 | sed "s/^/[platforms] $name (emulated): /"
  fi
}

if [ -n "$(ls "$WORK"/dist/*.whl 2>/dev/null)" ]; then
  system bullseye-amd64 bullseye amd64
  system trixie-amd64 trixie amd64
  IMPORT_SECONDS=$EMULATED_IMPORT_SECONDS system bookworm-arm64 bookworm arm64 "$ARM_TORCH"
fi

log "all $(($(date +%s) - start)) s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
