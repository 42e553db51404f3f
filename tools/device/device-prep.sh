#!/usr/bin/env bash
# Prepares what the GPU host lacks (it has no network, no pkg-config and no zstd, xxHash,
# GoogleTest or nlohmann_json development files): Debian's packages of those (and zlib's, and
# pkgconf itself), downloaded here with `apt-get download` and unpacked with `dpkg -x` into
# .device-deps/root (git-ignored), to be carried to the device with the working tree:
#   tools/device/device-prep.sh
#   run(command="bash tools/device/device-check.sh", carry=[".device-deps"])
#
# Made to work wherever the tree lands and without the host's /usr: every /usr path in the .pc
# files is rewritten relative to the file itself (${pcfiledir}/...), absolute symlinks are made
# relative, and device-check.sh runs the carried pkgconf (through a wrapper that finds its
# libpkgconf) and links with an rpath into the carried tree. tools/build/check_carried.py then
# asserts that no flag, header or library of these packages came from the host's /usr.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS=.device-deps
PACKAGES=(libzstd-dev libzstd1 libxxhash-dev libxxhash0 libgtest-dev zlib1g-dev zlib1g nlohmann-json3-dev pkgconf-bin
          libpkgconf3)
rm -rf "$DEPS" && mkdir -p "$DEPS/debs"
(cd "$DEPS/debs" && apt-get download "${PACKAGES[@]}" >/dev/null)
for deb in "$DEPS"/debs/*.deb; do
  dpkg -x "$deb" "$DEPS/root"
  dpkg-deb -f "$deb" Package Version | awk '{print $2}' | paste -sd' ' >> "$DEPS/packages.txt"
done
rm -rf "$DEPS/debs"

python3 - "$DEPS/root" <<'EOF'
import os, re, sys
root = os.path.abspath(sys.argv[1])
# Absolute symlinks (zlib1g-dev's libz.so -> /lib/...) would point into the host: make them
# relative inside the tree.
for d, dirs, files in os.walk(root):
    for f in dirs + files:
        p = os.path.join(d, f)
        if os.path.islink(p) and os.path.isabs(os.readlink(p)):
            target = root + os.readlink(p)
            os.unlink(p)
            os.symlink(os.path.relpath(target, d), p)
# Every /usr (and /lib) path of a .pc file, relative to the file: ${pcfiledir}/../../..
HOST = re.compile(r"(^|[\s=]|-I|-L)(/usr|/lib)(?=[/\s]|$)", re.M)  # nlohmann_json.pc: Cflags: -I/usr/include
pcs = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".pc")]
for pc in pcs:
    up = os.path.relpath(root, os.path.dirname(pc))
    text = open(pc).read()
    new = HOST.sub(lambda m: m.group(1) + "${pcfiledir}/" + up + m.group(2), text)
    # Debian's libzstd.pc says libdir=${exec_prefix}/lib, but the library is in the multiarch
    # folder beside pkgconfig/: on a host without its own copy, -lzstd would find nothing.
    libs = re.findall(r"-l(\S+)", "".join(l for l in new.splitlines(True) if l.startswith("Libs:")))
    here = os.path.dirname(os.path.dirname(pc))
    if libs and all(any(os.path.exists(os.path.join(here, f"lib{n}{ext}")) for ext in (".so", ".a"))
                    for n in libs if n not in ("pthread", "m", "dl", "rt")):
        new = re.sub(r"^libdir=.*$", "libdir=${pcfiledir}/..", new, flags=re.M)
    open(pc, "w").write(new)
    left = [l for l in new.splitlines() if HOST.search(l)]
    assert not left, f"{pc}: host paths left: {left}"
print(f"{len(pcs)} .pc files rewritten relative to themselves")
EOF
cat "$DEPS/packages.txt"
du -sh "$DEPS"
