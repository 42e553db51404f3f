"""tools/examples/verl_resume.py runs to success: as a script in a fresh process (converting
the checkpoint folder with `zckpt convert DIR -o OUTDIR`), and in this process through main()
(zckpt.convert per file)."""
import os
import re
import subprocess
import sys

import torch

from zckpt_testing import REPO, zckpt_bin

EXAMPLES = os.path.join(REPO, "tools", "examples")
EXAMPLE = os.path.join(EXAMPLES, "verl_resume.py")
SHARDS = ["extra_state_world_size_1_rank_0.zckpt", "fsdp_config.json",
          "model_world_size_1_rank_0.zckpt", "optim_world_size_1_rank_0.zckpt"]


def _assert_success(out, workdir, steps):
    assert out.strip().splitlines()[-1] == "verl resume: OK", out
    m = re.search(r"next step: resumed loss (\S+) == continued loss (\S+)", out)
    assert m and m.group(1) == m.group(2), out
    assert "restored 12 model tensors in place, 33 optimizer state tensors" in out
    actor = os.path.join(workdir, "checkpoints_zckpt", f"global_step_{steps}", "actor")
    assert sorted(os.listdir(actor)) == SHARDS


def test_verl_resume_script_with_cli_conversion(tmp_path):
    args = [sys.executable, EXAMPLE, "--steps", "4", "--workdir", str(tmp_path), "--zckpt-bin", zckpt_bin()]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "(zckpt convert DIR -o OUTDIR)" in r.stdout
    _assert_success(r.stdout, tmp_path, 4)


def test_verl_resume_main_with_python_conversion(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    import verl_resume

    threads = torch.get_num_threads()
    try:
        assert verl_resume.main(["--steps", "3", "--workdir", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "(zckpt.convert per file)" in out
    _assert_success(out, tmp_path, 3)
