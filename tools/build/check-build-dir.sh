#!/usr/bin/env bash
# check-build-dir.sh BUILD SOURCE: exits 0 when BUILD is not a configured meson folder yet, or was
# configured from SOURCE; else says which source it builds and exits 1. The sanitizer and fuzz
# scripts reuse build folders outside the checkout (/tmp/zckpt-*): one left by another clone
# would otherwise silently build and test that clone's code.
build=$1 src=$2
info=$build/meson-info/meson-info.json
[ -f "$info" ] || exit 0
configured=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["directories"]["source"])' "$info") || exit 0
[ "$(realpath "$configured")" = "$(realpath "$src")" ] && exit 0
echo "$build builds $configured, not $src: remove it, or point the script at another folder" >&2
exit 1
