#!/usr/bin/env bash
# Makes (once) the virtualenv holding moto[server], the local S3 server the object-storage tests
# start on localhost, and prints its python. Kept apart from the project's venv (torch) so the
# two never disturb each other; a fresh CI machine builds it on first use.
#
#   tools/s3/moto-venv.sh            # prints the venv's python (exit 0) or why not (exit 1)
#
# Environment: ZCKPT_S3_VENV (default ~/.cache/zckpt/venv-s3).
set -euo pipefail
VENV=${ZCKPT_S3_VENV:-$HOME/.cache/zckpt/venv-s3}
if ! "$VENV/bin/python" -c 'import moto.server, flask' >/dev/null 2>&1; then
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install -q 'moto[server]>=5,<6' >&2
fi
echo "$VENV/bin/python"
