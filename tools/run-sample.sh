#!/usr/bin/env bash
# The main job on a sample it makes itself: set up and build (tools/setup.sh), write a
# verl-style checkpoint shard with torch.save, convert it to .zckpt, verify it, list it, load it,
# export it back to .pt and check torch.load gives an equal object.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${ZCKPT_BUILD:-build}
VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
bash tools/setup.sh
exec "$VENV/bin/python" tools/sample.py --zckpt "$BUILD/tools/zckpt" --workdir "${ZCKPT_SAMPLE_DIR:-$BUILD/sample}"
