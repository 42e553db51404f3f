"""Files written by an older torch (Debian's python3-torch 1.13, when /usr/bin/python3 has it):
converted, verified, exported, and read back by the project's torch equal to the originals.
Skipped when that interpreter has no torch (it is never installed for this)."""
from __future__ import annotations

import filecmp
import os
import subprocess

import pytest
import torch

from torch_family import assert_deep_equal

OLD_PYTHON = os.environ.get("ZCKPT_OLD_TORCH_PYTHON", "/usr/bin/python3")  # an older torch, when present

WRITER = r"""
import collections, sys, torch
out = sys.argv[1]
torch.manual_seed(0)
base = torch.randn(4, 6)
net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
opt = torch.optim.Adam(net.parameters())
net(torch.randn(5, 4)).sum().backward()
opt.step()
obj = {
    "state": net.state_dict(), "optim": opt.state_dict(),
    "base": base, "row": base[2], "t": base.t(), "step": base[::2, 1::3], "tied": [base, base],
    "dtypes": {str(d): torch.arange(6).to(d) for d in (torch.float16, torch.bfloat16, torch.float64, torch.int8,
               torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64)},
    "scalar": torch.tensor(1.5), "empty": torch.empty(0, 2), "param": torch.nn.Parameter(torch.ones(2)),
    "py": {"huge": 2**100, "nan": float("nan"), "bytes": b"\x00\xff", "set": {1, 2}, "tuple": (1, "a")},
}
torch.save(obj, out + "/old_zip.pt")
torch.save(obj, out + "/old_legacy.pt", _use_new_zipfile_serialization=False)
print(torch.__version__)
"""


def old_torch_version():
    if not os.path.exists(OLD_PYTHON):
        return None
    p = subprocess.run([OLD_PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


pytestmark = pytest.mark.skipif(old_torch_version() is None, reason=f"{OLD_PYTHON} has no torch (python3-torch is "
                                "optional and not installed here)")


@pytest.fixture(scope="module")
def old_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("old_torch")
    subprocess.run([OLD_PYTHON, "-c", WRITER, str(out)], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("name", ["old_zip.pt", "old_legacy.pt"])
def test_old_torch_file_round_trips(name, old_files, zckpt, tmp_path):
    src = old_files / name
    zckpt.ok("convert", "--quiet", src, "-o", tmp_path / "x.zckpt")
    zckpt.ok("verify", tmp_path / "x.zckpt")
    zckpt.ok("export", tmp_path / "x.zckpt", "-o", tmp_path / name)
    assert_deep_equal(torch.load(tmp_path / name, weights_only=False), torch.load(src, weights_only=False))
    if name == "old_legacy.pt":
        assert filecmp.cmp(src, tmp_path / name, shallow=False)
    ls = zckpt.ls(tmp_path / "x.zckpt")
    names = {t["name"] for t in ls["tensors"]}
    assert {"state.0.weight", "optim.state.0.exp_avg", "row", "dtypes.torch.bfloat16"} <= names
