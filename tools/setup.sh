#!/usr/bin/env bash
# Installs whatever is missing on a fresh Debian machine, then configures and builds zckpt.
#
#   tools/setup.sh            # build into ./build
#
# Environment:
#   ZCKPT_VENV   the project's virtualenv (default ~/.cache/zckpt/venv, kept outside the
#                checkout so a fresh clone reuses the 3 GB torch install)
#   ZCKPT_BUILD  build folder (default build)
#   ZCKPT_MESON_ARGS  extra `meson setup` arguments
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
BUILD=${ZCKPT_BUILD:-build}

log() { printf '[setup] %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------------
APT_PACKAGES=(build-essential pkg-config meson ninja-build libzstd-dev libxxhash-dev zlib1g-dev nlohmann-json3-dev
              libgtest-dev pybind11-dev clang libclang-rt-14-dev cmake libcurl4-openssl-dev
              pypy3 pypy3-venv)  # PyPy 3.9: the wheel under a second Python (tools/ci/torch-matrix.sh)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
BASE_PY=${ZCKPT_BASE_PYTHON:-python3}
if ! "$BASE_PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then missing+=(python3-venv); fi
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- the project's virtualenv (torch, numpy, pytest, peers) -----------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import torch, numpy, pytest, safetensors' >/dev/null 2>&1; then
  log "installing Python packages into $VENV (torch is ~3 GB the first time)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r tools/requirements.txt
fi

# --- configure and build ---------------------------------------------------------------------
# shellcheck disable=SC2086
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" -Dpython="$VENV/bin/python" ${ZCKPT_MESON_ARGS:-}
else
  meson setup --reconfigure "$BUILD" -Dpython="$VENV/bin/python" ${ZCKPT_MESON_ARGS:-} >/dev/null
fi
ninja -C "$BUILD" -j "$(nproc)"
log "built into $BUILD (zckpt: $BUILD/tools/zckpt)"
