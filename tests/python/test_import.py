"""The done-criterion: `meson devenv -C build python -c "import zckpt"` in a fresh process
(with the project's virtualenv active, as tools/setup.sh leaves it) imports the built package."""
import os
import shutil
import subprocess
import sys

import pytest

import zckpt
from zckpt_testing import build_root

PUBLIC = ["load", "load_into", "save", "async_save", "AsyncSaver", "convert", "export", "verify", "ZckptError",
          "CorruptError", "UnsafeError", "IoError", "NotAContainerError", "UnsupportedError", "InvalidArgumentError",
          "CancelledError", "IncompleteCheckpointError", "patch_torch_load", "unpatch_torch_load",
          "torch_load_from_zckpt",
          "OutOfMemoryError", "patch_stats", "reset_patch_stats", "iter_tensors", "container_files"]


def test_public_api():
    assert sorted(zckpt.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(zckpt, name) is not None, name


def test_import_in_fresh_process_through_meson_devenv(tmp_path):
    meson = shutil.which("meson")
    if meson is None:
        pytest.skip("meson is not on PATH")
    root = build_root()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MESON_DEVENV", "MESON_PROJECT_NAME")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # the venv, activated
    code = "import zckpt, zckpt._C, torch; print(zckpt.__file__); print(sorted(zckpt.__all__))"
    r = subprocess.run([meson, "devenv", "-C", root, "python", "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert os.path.realpath(lines[-2]) == os.path.realpath(os.path.join(root, "src", "python", "zckpt", "__init__.py"))
    assert lines[-1] == str(sorted(PUBLIC))


def test_plain_interpreter_without_devenv_does_not_see_the_build(tmp_path):
    """The positive test above is meaningful: without devenv's PYTHONPATH there is no zckpt."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import zckpt"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    if r.returncode == 0:
        pytest.skip("zckpt is installed in this interpreter: nothing to contrast with")
    assert "No module named 'zckpt'" in r.stderr
