"""Asserts that a build configured with the carried packages (.device-deps/root, made by
tools/device/device-prep.sh) takes nothing of theirs from the host's /usr.

    check_carried.py BUILD DEPS_ROOT            after `meson setup`: the flags
    check_carried.py BUILD DEPS_ROOT --built    after a build: also the headers each object
                                                 really included (ninja -t deps) and where the
                                                 built binaries' carried libraries resolve (ldd)

Problems: an -I/-isystem/-L flag into /usr; a carried package's library linked from /usr; a
carried package's header included from /usr/include; a carried library that the dynamic linker
finds under /usr instead of DEPS_ROOT. On the GPU host those files do not exist, so any of these
is a build that worked here only by luck. Prints one line per problem, then
`carried: ok (...)` or `carried: N problem(s)`; exits 1 on problems.
"""
import json
import os
import re
import shlex
import subprocess
import sys

HOST_DIRS = ("/usr/include", "/usr/local/include", "/usr/lib", "/usr/local/lib", "/lib")


def under(path, prefixes):
    path = os.path.normpath(path)
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def carried_files(root):
    headers, libs = set(), set()
    inc = os.path.join(root, "usr", "include")
    for d, _, files in os.walk(root):
        for f in files:
            full = os.path.join(d, f)
            if full.startswith(inc + "/"):
                headers.add(os.path.relpath(full, inc))
            elif re.match(r"lib.*\.(so(\.\d+)*|a)$", f):
                libs.add(f)
    return headers, libs


def flag_paths(args):
    """(flag, path) for each include or library search path in a compiler/linker argument list."""
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        for flag in ("-isystem", "-idirafter", "-iquote", "-I", "-L"):
            if a == flag and i + 1 < len(args):
                out.append((flag, args[i + 1]))
                i += 1
                break
            if a.startswith(flag) and len(a) > len(flag):
                out.append((flag, a[len(flag):]))
                break
        i += 1
    return out


def check_flags(build, libs, problems):
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    for c in commands:
        for flag, path in flag_paths(shlex.split(c["command"])):
            if os.path.isabs(path) and under(path, HOST_DIRS):
                problems.append(f"compile flag {flag}{path} (host /usr) in {c['output']}")
    lib_re = re.compile(r"^(/usr|/lib)\S*/(" + "|".join(re.escape(x) for x in sorted(libs)) + r")$") if libs else None
    with open(os.path.join(build, "build.ninja")) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("LINK_ARGS ="):
                continue
            args = shlex.split(line[len("LINK_ARGS ="):])
            for flag, path in flag_paths(args):
                if os.path.isabs(path) and under(path, HOST_DIRS):
                    problems.append(f"link flag {flag}{path} (host /usr)")
            for a in args:
                if lib_re and lib_re.match(a):
                    problems.append(f"carried library linked from the host: {a}")
    return len(commands)


def check_deps(build, root, headers, problems):
    out = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True, check=True).stdout
    used = set()
    for line in out.splitlines():
        if not line.startswith("    "):
            continue
        path = os.path.normpath(os.path.join(build, line.strip()))
        for prefix in ("/usr/include/", "/usr/local/include/"):
            if path.startswith(prefix) and path[len(prefix):] in headers:
                problems.append(f"header of a carried package included from the host: {path}")
        if path.startswith(os.path.join(root, "usr", "include") + "/"):
            used.add(os.path.relpath(path, os.path.join(root, "usr", "include")))
    return used


def elf_files(build):
    for d, _, files in os.walk(build):
        if "meson-private" in d or ".p" in os.path.basename(d):
            continue
        for f in files:
            full = os.path.join(d, f)
            if os.path.islink(full) or not os.access(full, os.X_OK) and not f.endswith(".so"):
                continue
            with open(full, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    yield full


def check_ldd(build, root, libs, problems):
    sonames = {x for x in libs if ".so." in x}
    resolved = set()
    for elf in elf_files(build):
        r = subprocess.run(["ldd", elf], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            m = re.match(r"\s*(\S+) => (\S+)", line)
            if not m or m.group(1) not in sonames:
                continue
            if m.group(2) == "not" or not os.path.realpath(m.group(2)).startswith(os.path.realpath(root) + "/"):
                problems.append(f"{os.path.relpath(elf, build)}: {m.group(1)} resolves to {m.group(2)}, not the carried copy")
            else:
                resolved.add(m.group(1))
    return resolved


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    build, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    built = "--built" in sys.argv[3:]
    headers, libs = carried_files(root)
    problems = []
    n = check_flags(build, libs, problems)
    facts = [f"{n} compile commands"]
    if built:
        used = check_deps(build, root, headers, problems)
        facts.append("carried headers used: " + (", ".join(sorted(used)[:8]) + (" ..." if len(used) > 8 else "") or "none"))
        if not used:
            problems.append("no header of the carried packages was included at all")
        resolved = check_ldd(build, root, libs, problems)
        facts.append("carried libraries loaded: " + (", ".join(sorted(resolved)) or "none"))
    for p in problems:
        print(p)
    print(f"carried: {len(problems)} problem(s)" if problems else f"carried: ok ({'; '.join(facts)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
