"""verl 0.9.1 itself across `zckpt reshard` / `zckpt merge --files optim`, and transformers'
from_pretrained under patch_torch_load: tools/examples/verl_reshard_check.py run by a Python
that has verl and transformers (their own virtualenv seeing the project's torch, named by
ZCKPT_VERL_PYTHON). The same cases run without verl in test_reshard_resume.py on the
verl-mirroring save/load of fsdp_cases.py."""
import os
import subprocess

import pytest

import zckpt_testing

VERL_PYTHON = os.environ.get("ZCKPT_VERL_PYTHON", "")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@pytest.mark.skipif(not VERL_PYTHON, reason="verl/transformers are not in the project's virtualenv: set "
                                            "ZCKPT_VERL_PYTHON to a Python that has verl==0.9.1 (see "
                                            "tools/examples/verl_real_check.py)")
def test_verl_resumes_resharded_fsdp1_and_fsdp2_files_and_from_pretrained_reads_containers():
    build = os.environ.get("ZCKPT_BUILD_ROOT", os.path.join(ROOT, "build"))
    env = dict(os.environ, ZCKPT_BIN=zckpt_testing.zckpt_bin(), PYTHONPATH=os.path.join(build, "src", "python"))
    r = subprocess.run([VERL_PYTHON, os.path.join(ROOT, "tools", "examples", "verl_reshard_check.py")],
                       capture_output=True, text=True, env=env, timeout=900)
    out = r.stdout
    assert r.returncode == 0 and out.rstrip().endswith("verl reshard: OK"), out[-3000:] + r.stderr[-3000:]
    # Every case ran: FSDP1 to 4 ranks (4 lines) and 1, FSDP2 likewise, the merge, from_pretrained.
    assert out.count("fsdp 2 -> ") == 5 and out.count("fsdp2 2 -> ") == 5, out
    assert "equals FSDP's full_optim_state_dict" in out and "state equal to without the patch" in out, out
