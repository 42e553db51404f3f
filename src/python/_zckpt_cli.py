"""The `zckpt` command of the Python package (pyproject.toml's console script) and `python -m zckpt`.

Runs the zckpt binary (tools/zckpt). The binary is found, in order: $ZCKPT_CLI_DIR (`meson devenv` sets it to the build's tools/), bin/
inside the installed zckpt package (a wheel), then the folder meson installed it to (CLI_DIR of
zckpt/_build_info.py). Imports neither torch nor zckpt, so the command starts as the binary does.
"""
import importlib.util
import os
import sys


def _package_dir():
    spec = importlib.util.find_spec("zckpt")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _installed_cli_dir(package_dir):
    path = os.path.join(package_dir, "_build_info.py")
    info = {}
    try:
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), path, "exec"), info)  # noqa: S102 - our own generated constants
    except OSError:
        return None
    return info.get("CLI_DIR") or None


def candidates():
    """The folders that may hold the zckpt binary, in the order they are tried."""
    dirs = []
    if os.environ.get("ZCKPT_CLI_DIR"):
        dirs.append(os.environ["ZCKPT_CLI_DIR"])
    package_dir = _package_dir()
    if package_dir:
        dirs.append(os.path.join(package_dir, "bin"))
        installed = _installed_cli_dir(package_dir)
        if installed:
            dirs.append(installed)
    return dirs


def main():
    # `zckpt reshard` runs `python -m zckpt reshard`: with this Python, which has the package.
    os.environ.setdefault("ZCKPT_PYTHON", sys.executable)
    tried = []
    for d in candidates():
        exe = os.path.join(d, "zckpt")
        if os.access(exe, os.X_OK) and not os.path.isdir(exe):
            os.execv(exe, [exe, *sys.argv[1:]])
        tried.append(exe)
    sys.stderr.write("zckpt: the zckpt binary is missing (looked for " + (", ".join(tried) or "the zckpt package") +
                     "); reinstall zckpt\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
