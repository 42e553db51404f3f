"""Shared pieces of the end-to-end tests of `zckpt convert / verify / ls / export`.

The tool is found through ZCKPT_BIN (tools/run-tests.sh sets it to $BUILD/tools/zckpt), else
build/tools/zckpt under the repository root; without one every test here is skipped.
The torch-written fixtures (tests/fixtures/torch_family.py) are written once per session.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures"))

import torch_family  # noqa: E402

# Family members this torch can build, known at collection time (parametrize ids).
FAMILY_NAMES = [f.name for f in torch_family.FAMILY if not f.needs()]
LEGACY_NAMES = [n for n in FAMILY_NAMES if torch_family.BY_NAME[n].format == "legacy"]
ZIP_NAMES = [n for n in FAMILY_NAMES if torch_family.BY_NAME[n].format == "zip"]


def zckpt_binary():
    path = os.environ.get("ZCKPT_BIN") or os.path.join(REPO, "build", "tools", "zckpt")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


@dataclasses.dataclass
class Run:
    args: tuple
    rc: int
    out: str
    err: str

    @property
    def text(self):
        return self.out + self.err

    def json(self):
        return json.loads(self.out)


class Zckpt:
    """Runs the zckpt tool; a run that ends by a signal (a crash) fails the test right there."""

    def __init__(self, path):
        self.path = path

    def __call__(self, *args, cwd=None, timeout=300) -> Run:
        args = tuple(str(a) for a in args)
        p = subprocess.run([self.path, *args], cwd=cwd, capture_output=True, timeout=timeout)
        run = Run(args, p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))
        assert run.rc >= 0, f"zckpt {' '.join(args)} was killed by signal {-run.rc}:\n{run.text}"
        return run

    def ok(self, *args, **kw) -> Run:
        run = self(*args, **kw)
        assert run.rc == 0, f"zckpt {' '.join(run.args)} exited {run.rc}:\n{run.text}"
        return run

    def ls(self, path) -> dict:
        return self.ok("ls", "--json", path).json()


@pytest.fixture(scope="session")
def zckpt():
    path = zckpt_binary()
    if not path:
        pytest.skip("no zckpt binary: set ZCKPT_BIN or build into build/ (meson setup build && ninja -C build)")
    return Zckpt(path)


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """{name: torch_family.Written} for every fixture this torch can build."""
    return torch_family.write_family(str(tmp_path_factory.mktemp("family")))


@pytest.fixture(scope="session")
def original(family):
    """original(name): torch.load of the family file, loaded once per session (do not modify)."""
    cache = {}

    def load(name):
        if name not in cache:
            cache[name] = family[name].load()
        return cache[name]

    return load


@pytest.fixture(scope="session")
def converted(family, zckpt, tmp_path_factory):
    """{name: (Run of `zckpt convert`, path of the .zckpt)}, default options."""
    out = tmp_path_factory.mktemp("converted")
    result = {}
    for name, w in family.items():
        dst = out / (os.path.splitext(name)[0] + ".zckpt")
        result[name] = (zckpt("convert", "--quiet", w.path, "-o", dst), str(dst))
    return result


@pytest.fixture(scope="session")
def verified(converted, zckpt):
    """{name: this file's entry of one `zckpt verify --json` over every converted file}, and the run."""
    names = [name for name, (run, _) in converted.items() if run.rc == 0]
    run = zckpt("verify", "--json", *(converted[n][1] for n in names))
    return dict(zip(names, run.json())), run


@pytest.fixture(scope="session")
def exported(converted, zckpt, tmp_path_factory):
    """{name: Run of `zckpt export` of the converted file, path of the .pt it wrote}."""
    out = tmp_path_factory.mktemp("exported")
    return {name: (zckpt("export", dst, "-o", out / name), out / name)
            for name, (run, dst) in converted.items() if run.rc == 0}


@pytest.fixture(scope="session")
def listings(converted, zckpt):
    """{name: `zckpt ls --json` of the converted file} for the files that converted."""
    return {name: zckpt.ls(dst) for name, (run, dst) in converted.items() if run.rc == 0}


def zip_records(path) -> dict[str, bytes]:
    """{record name without the archive prefix: bytes}, in archive order."""
    with zipfile.ZipFile(path) as z:
        return {info.filename.split("/", 1)[1]: z.read(info.filename) for info in z.infolist()}


def zip_prefix(path) -> str:
    with zipfile.ZipFile(path) as z:
        return z.infolist()[0].filename.split("/", 1)[0]


def rewrite_zip(src, dst, replace=None, drop=(), add=None):
    """Copies the torch archive `src` to `dst` with Python's zipfile (STORED), replacing the
    records named in `replace` ({name without prefix: bytes}), leaving out those in `drop`, and
    appending those in `add`."""
    replace, add = replace or {}, add or {}
    prefix = zip_prefix(src)
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as out:
        for name, data in zip_records(src).items():
            if name not in drop:
                out.writestr(f"{prefix}/{name}", replace.get(name, data))
        for name, data in add.items():
            out.writestr(f"{prefix}/{name}", data)


def assert_nothing_written(out_dir, what=""):
    """The output folder holds nothing: no destination, no temporary file."""
    left = sorted(os.listdir(out_dir))
    assert left == [], f"{what}: files left in the output folder: {left}"
