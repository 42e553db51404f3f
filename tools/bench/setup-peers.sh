#!/usr/bin/env bash
# Makes the virtualenv the benchmark's peers live in: tensorizer, fastsafetensors and Run:ai's
# model streamer (with its S3 backend, for tools/bench/bench_s3.py), installed from PyPI into a
# virtualenv of their own that sees the project's virtualenv (torch, numpy, safetensors) through
# a .pth file, so installing them can never upgrade, downgrade or replace the shared torch.
#
#   tools/bench/setup-peers.sh          # prints the peers virtualenv's python on its last line
#
# Environment: ZCKPT_VENV (the project's virtualenv, default ~/.cache/zckpt/venv),
# ZCKPT_PEERS_VENV (default ~/.cache/zckpt/peers-venv).
set -euo pipefail
VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
PEERS=${ZCKPT_PEERS_VENV:-$HOME/.cache/zckpt/peers-venv}
log() { printf '[setup-peers] %s\n' "$*" >&2; }

[ -x "$VENV/bin/python" ] || { log "no project virtualenv at $VENV (run tools/setup.sh first)"; exit 2; }
# The same interpreter as the project's virtualenv, so its site-packages are importable.
BASE=$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x "$PEERS/bin/python" ]; then
  log "creating $PEERS (base $BASE)"
  "$BASE" -m venv "$PEERS"
  # venv's own setuptools would shadow the project venv's (torch asks for a newer one).
  "$PEERS/bin/python" -m pip uninstall -q -y setuptools
fi
PSITE=$("$PEERS/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$SITE" > "$PSITE/zckpt-project-venv.pth"

# Each peer with its own dependencies, minus torch/numpy/safetensors (seen through the .pth):
# --no-deps plus the listed extras, so pip never resolves (and replaces) torch.
PEER_PACKAGES=(tensorizer==2.12.1 fastsafetensors==0.5.0 runai-model-streamer==0.17.1 runai-model-streamer-s3==0.17.1)
PEER_DEPS=(
  boto3 hiredis libnacl protobuf psutil redis  # tensorizer 2.12 (besides torch, numpy); boto3: runai-model-streamer-s3 too
  typer                                        # fastsafetensors 0.5
  humanize                                     # runai-model-streamer 0.17 (besides torch, numpy)
)
if ! "$PEERS/bin/python" -c 'import tensorizer, fastsafetensors, runai_model_streamer, runai_model_streamer_s3' >/dev/null 2>&1; then
  log "installing ${PEER_PACKAGES[*]} into $PEERS"
  "$PEERS/bin/python" -m pip install -q --no-deps "${PEER_PACKAGES[@]}"
  "$PEERS/bin/python" -m pip install -q "${PEER_DEPS[@]}"
fi
# The shared torch must still be the one the peers see.
"$PEERS/bin/python" - "$SITE" <<'PY'
import sys, torch
assert torch.__file__.startswith(sys.argv[1]), f"peers venv sees another torch: {torch.__file__}"
PY
echo "$PEERS/bin/python"
