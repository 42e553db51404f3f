"""tools/examples/verl_resume.py runs to success: as a script in a fresh process (FSDP1 at world
size 2, converting the checkpoint folder with `zckpt convert DIR -o OUTDIR`), and in this process
through main() (FSDP2 at world size 1, zckpt.convert per file). Both strategies at both world
sizes are tests/python/test_fsdp.py's; this keeps the example itself working."""
import os
import re
import subprocess
import sys

from zckpt_testing import REPO, zckpt_bin

EXAMPLES = os.path.join(REPO, "tools", "examples")
EXAMPLE = os.path.join(EXAMPLES, "verl_resume.py")


def _shards(ws):
    return sorted([f"{k}_world_size_{ws}_rank_{r}.zckpt" for k in ("extra_state", "model", "optim") for r in range(ws)]
                  + ["fsdp_config.json"])


def _assert_success(out, strategies, ws):
    assert out.strip().splitlines()[-1] == "verl resume: OK", out
    for strategy in strategies:
        assert f"{strategy} (" in out and f"world size {ws}: saved and converted {', '.join(_shards(ws))}" in out, out
    lines = re.findall(r"rank (\d+): restored (\d+) live parameter shards in place, (\d+) optimizer state tensors; "
                       r"next step: resumed loss \S+ == continued loss", out)
    assert len(lines) == ws * len(strategies), out
    if "fsdp" in strategies:  # FSDP1: one FlatParameter per unit (2 blocks + root), 3 AdamW tensors each
        assert ("0", "3", "9") in lines, out


def test_verl_resume_fsdp1_world_size_2_cli_conversion(tmp_path):
    args = [sys.executable, EXAMPLE, "--steps", "3", "--workdir", str(tmp_path), "--zckpt-bin", zckpt_bin(),
            "--strategy", "fsdp"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "converted with zckpt convert DIR -o OUTDIR" in r.stdout
    _assert_success(r.stdout, ("fsdp",), 2)


def test_verl_resume_main_fsdp2_world_size_1(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    import verl_resume

    assert verl_resume.main(["--steps", "2", "--workdir", str(tmp_path), "--strategy", "fsdp2",
                             "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "converted with zckpt.convert per file" in out
    _assert_success(out, ("fsdp2",), 1)
