# Sourced by tools/ci/torch-matrix.sh and tools/ci/platforms.sh: what a built manylinux wheel
# must be, one `ok NAME` / `FAIL NAME: why` line per check.
#
#   check_wheel WHEEL ARCH DIR   (DIR: an empty folder to unpack it into)
#
# wheel_tag_<arch>: `auditwheel show` (build-wheel.sh's pinned one) proves manylinux_2_28_ARCH.
# wheel_needs_glibc_only_<arch>: every ELF file inside needs glibc's libraries alone (what
# auditwheel's policy allows and more strictly: no libstdc++, no libz, no libcurl).
check_wheel() {
  local whl arch=$2 dir=$3 f lib needed bad="" loader show elves=0
  whl=$(realpath "$1")
  local auditwheel
  auditwheel=$(ls "${ZCKPT_WHEEL_CACHE:-$HOME/.cache/zckpt/wheel}"/tools-*/bin/auditwheel | head -n1)
  case $arch in x86_64) loader=ld-linux-x86-64.so.2 ;; aarch64) loader=ld-linux-aarch64.so.1 ;; esac
  show=$("$auditwheel" show "$whl" 2>&1 | tr -s ' \n' ' ')  # it wraps its lines
  if grep -q "consistent with the following platform tag: \"manylinux_2_28_$arch\"" <<<"$show"; then
    echo "ok wheel_tag_$arch $(basename "$whl") ($(du -h "$whl" | cut -f1))"
  else
    echo "FAIL wheel_tag_$arch: $(basename "$whl"): $(tr '\n' ' ' <<<"$show" | cut -c1-400)"
  fi
  rm -rf "$dir" && mkdir -p "$dir" && (cd "$dir" && /usr/bin/python3 -m zipfile -e "$whl" .) ||
    { echo "FAIL wheel_needs_glibc_only_$arch: $whl does not unpack"; return; }
  while IFS= read -r f; do
    needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    echo "  ${f#"$dir/"}: $needed"
    elves=$((elves + 1))
    for lib in $needed; do
      case $lib in libc.so.6|libm.so.6|libpthread.so.0|libdl.so.2|librt.so.1|"$loader") ;; *) bad+=" $lib" ;; esac
    done
  done < <(find "$dir" -type f \( -name '*.so' -o -path '*/bin/*' \))
  # The library and the binary: fewer means the wheel lost one.
  [ "$elves" -ge 2 ] || bad+=" (only $elves ELF files)"
  [ -z "$bad" ] && echo "ok wheel_needs_glibc_only_$arch" || echo "FAIL wheel_needs_glibc_only_$arch:$bad"
}
