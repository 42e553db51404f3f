#!/usr/bin/env bash
# Prepares what the GPU host lacks (it has no network): Debian's -dev packages of zstd, xxHash,
# GoogleTest and nlohmann_json, downloaded here with apt and unpacked with `dpkg -x` into .device-deps/
# (git-ignored), to be carried to the device with the working tree:
#   tools/device-prep.sh
#   run(command="bash tools/device-check.sh", carry=[".device-deps"])
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=.device-deps
rm -rf "$DEPS" && mkdir -p "$DEPS/debs"
(cd "$DEPS/debs" && apt-get download libzstd-dev libzstd1 libxxhash-dev libxxhash0 libgtest-dev zlib1g-dev nlohmann-json3-dev >/dev/null)
for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$DEPS/root"; done
rm -rf "$DEPS/debs"
du -sh "$DEPS"
