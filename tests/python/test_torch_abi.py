"""The torch the test-only zckpt._C runs under (torch_abi_check.py), and `python -m zckpt` in the build.

The installed package has no _C (tools/install/test-install.sh's pip_package_is_torch_free); here:
the rule itself, case by case, and the record this build wrote."""
import os
import subprocess
import sys

import pytest
import torch

import zckpt
from zckpt import _build_info, _torch_build
from zckpt_testing import build_root
import torch_abi_check as _abi

CUDA13 = ("2.15.0+cu132", "13.2", 1)


@pytest.mark.parametrize("running", [
    ("2.15.0+cu132", "13.2", 1),   # the same torch
    ("2.15.1", "13.2", 1),         # a patch release
    ("2.15.0+cu130", "13.0", 1),   # another CUDA 13 minor: same libcudart soname
    ("2.15.0", "13.2", None),      # a torch that does not say its ABI flag
])
def test_compatible(running):
    assert _abi.incompatibility(CUDA13, running) is None


@pytest.mark.parametrize("running, why", [
    (("2.14.1+cu130", "13.0", 1), "torch 2.14.1+cu130 is not a 2.15 release"),
    (("3.15.0", "13.2", 1), "is not a 2.15 release"),
    (("2.1.0", "13.2", 1), "is not a 2.15 release"),  # 2.1 is not a prefix match of 2.15
    (("2.15.0+cpu", "", 1), "it is a CPU build of torch, zckpt was built for CUDA 13"),
    (("2.15.0+cu128", "12.8", 1), "it is a CUDA 12 build of torch, zckpt was built for CUDA 13"),
    (("2.15.0+cu132", "13.2", 0), "its _GLIBCXX_USE_CXX11_ABI is 0, zckpt was built with 1"),
])
def test_incompatible(running, why):
    got = _abi.incompatibility(CUDA13, running)
    assert got is not None and why in got, got


def test_cpu_build_refuses_cuda_torch():
    assert "CUDA 13 build of torch, zckpt was built for CPU" in _abi.incompatibility(("2.15.0+cpu", "", 1), CUDA13)


def test_this_build_records_the_torch_it_runs_under():
    """The record is what meson saw (tools/build/torch_info.py), i.e. this very torch."""
    assert _torch_build.TORCH_VERSION == torch.__version__
    assert _torch_build.TORCH_CUDA == (torch.version.cuda or "")
    assert _torch_build.TORCH_CXX11_ABI == int(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert _build_info.VERSION == subprocess.run([os.path.join(build_root(), "tools", "zckpt"), "--version"],
                                                 capture_output=True, text=True, timeout=60).stdout.split()[1]


def test_python_dash_m_runs_the_built_tool(tmp_path):
    """`python -m zckpt` in `meson devenv` runs BUILD/tools/zckpt (ZCKPT_CLI_DIR), exit codes kept."""
    env = dict(os.environ, ZCKPT_CLI_DIR=os.path.join(build_root(), "tools"))
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(zckpt.__file__))
    r = subprocess.run([sys.executable, "-m", "zckpt", "--version"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("zckpt "), r.stderr
    bad = tmp_path / "not.zckpt"
    bad.write_bytes(b"not a container")
    r = subprocess.run([sys.executable, "-m", "zckpt", "verify", str(bad)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)  # not a container: could not run


def test_console_shim_reports_a_missing_binary(tmp_path):
    """No binary where the shim looks: exit 2 naming the places, never a silent success."""
    shim = tmp_path / "_zckpt_cli.py"
    shim.write_text(open(os.path.join(os.path.dirname(os.path.dirname(zckpt.__file__)), "_zckpt_cli.py")).read())
    env = dict(os.environ, ZCKPT_CLI_DIR=str(tmp_path / "empty"))
    env.pop("PYTHONPATH", None)
    # -S: no site-packages, so no installed zckpt package can supply a binary either.
    r = subprocess.run([sys.executable, "-S", str(shim), "--version"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "the zckpt binary is missing" in r.stderr and "empty/zckpt" in r.stderr, r.stderr
