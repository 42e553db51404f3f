#!/usr/bin/env python3
"""The layers of src/, drawn from the includes, and the rule they follow.

    python3 tools/build/layers.py           # check: exit 1 naming every include that breaks a rule
    python3 tools/build/layers.py --graph   # the folder -> folder arrows (quoted includes), counted

A folder may include its own headers, the public headers (include/zckpt/) and the folders
ALLOWED lists for it (each folder's README says the same). Public headers include only public
headers; the command-line tool (tools/zckpt/) only public headers and its own.
"""
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = {"common"}
LOW = BASE | {"remote", "format", "pickle", "pt", "safetensors"}
SHARED = LOW | {"checkpoint"}
ALLOWED = {
    "common": set(),
    "remote": BASE,
    "format": BASE,  # a store (s3://) reaches it through common/byte_store.h, never by name
    "pickle": BASE,
    "pt": BASE,
    "safetensors": BASE,
    "checkpoint": LOW,
    "convert": SHARED,
    "merge": SHARED,
    "loader": SHARED,
    "save": SHARED,
    "python": SHARED | {"convert", "merge", "loader", "save"},
    "include/zckpt": set(),
    "tools/zckpt": set(),  # the CLI: public headers and its own only
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "src":
        return rel.parts[1]
    return "/".join(rel.parts[:2])


def arrows():
    files = [p for d in ("src", "include", "tools/zckpt") for p in (ROOT / d).rglob("*")
             if p.suffix in (".h", ".cc")]
    for f in sorted(files):
        src = folder_of(f)
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            if "/" not in inc:
                dst = src
            elif inc.startswith("zckpt/"):
                dst = "include/zckpt"
            else:
                dst = inc.split("/")[0]
            if dst != src:
                yield f.relative_to(ROOT), src, dst, inc


def main():
    if "--graph" in sys.argv:
        counts = collections.Counter((s, d) for _, s, d, _ in arrows())
        for (s, d), n in sorted(counts.items()):
            print(f"{s:14} -> {d:14} {n:3}")
        return 0
    bad = []
    for f, src, dst, inc in arrows():
        allowed = ALLOWED.get(src)
        if allowed is None or dst == "include/zckpt":
            continue
        if dst not in allowed:
            bad.append(f"{f}: includes \"{inc}\" ({src} may include {', '.join(sorted(allowed)) or 'nothing'} "
                       "besides the public headers)")
    for line in bad:
        print(line)
    print(f"layers: {'OK' if not bad else str(len(bad)) + ' includes break the layering'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
