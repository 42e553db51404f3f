#!/usr/bin/env bash
# Regenerates format-spec/vectors/ (spec §10) with the make_spec_vectors helper of a build:
#
#   tools/make-spec-vectors.sh BUILD/tests/format/make_spec_vectors [OUTPUT_DIR]
#
# Builds nothing itself. The vectors are committed; tests/format/vectors_test.cc checks that
# they decode as their JSON says and that the helper still reproduces them, so run this only
# after a deliberate change to the format or to the vectors, and commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ ! -x "$1" ]; then
  echo "usage: $0 PATH/TO/make_spec_vectors [OUTPUT_DIR]" >&2
  exit 2
fi
helper=$1
out=${2:-format-spec/vectors}
mkdir -p "$out"
rm -f "$out"/*.zckpt "$out"/*.json
"$helper" "$out"
