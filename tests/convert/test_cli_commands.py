"""The command line a newcomer meets: `verify DIR`, `zckpt help CMD`, no-clobber with --force,
--progress for terminals and for logs, hints for a file given to the wrong command, and the
exit codes each --help documents."""
from __future__ import annotations

import os
import re
import shutil

import pytest
import torch

from conftest import assert_nothing_written

COMMANDS = ["convert", "verify", "ls", "export", "merge", "load", "bench"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, zckpt):
    """A .pt and its container."""
    root = tmp_path_factory.mktemp("pair")
    pt = root / "m.pt"
    torch.save({"w": torch.arange(300000, dtype=torch.float32), "b": torch.ones(3)}, pt)
    zc = root / "m.zckpt"
    zckpt.ok("convert", "--quiet", pt, "-o", zc)
    return pt, zc


# ---- help ------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_help_command_is_command_help(command, zckpt):
    a, b = zckpt.ok("help", command), zckpt.ok(command, "--help")
    assert a.out == b.out and a.out.startswith(f"usage: zckpt {command}")


@pytest.mark.parametrize("command", ["convert", "verify", "export", "merge", "load", "bench"])
def test_help_documents_the_exit_codes(command, zckpt):
    text = zckpt.ok(command, "--help").out
    assert "Exit codes:" in text
    for code in ("0", "1", "2"):
        assert re.search(rf"^  {code}  \S", text, re.M), (command, code, text)


def test_help_alone_and_unknown(zckpt):
    assert "zckpt help COMMAND" in zckpt.ok("help").out
    assert zckpt("help", "nonsense").rc == 2
    assert zckpt("help", "convert", "verify").rc == 2


# ---- verify DIR ------------------------------------------------------------------------------

def test_verify_a_folder(pair, zckpt, tmp_path):
    pt, zc = pair
    root = tmp_path / "ckpt"
    (root / "a" / "b").mkdir(parents=True)
    shutil.copy(zc, root / "one.zckpt")
    shutil.copy(zc, root / "a" / "b" / "no_extension")  # found by its magic, not its name
    shutil.copy(pt, root / "a" / "model.pt")              # not a container: not listed
    (root / "config.json").write_text("{}")
    run = zckpt.ok("verify", root)
    lines = run.out.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == [str(root / "a" / "b" / "no_extension"), str(root / "one.zckpt")]
    assert all(": OK (" in line for line in lines[:-1])
    assert lines[-1] == "verify: 2 checked: 2 OK, 0 CORRUPT, 0 ERROR"

    bad = root / "a" / "bad.zckpt"
    data = bytearray(zc.read_bytes())
    data[8192] ^= 0xFF  # in the first storage's data
    bad.write_bytes(bytes(data))
    run = zckpt("verify", root)
    assert run.rc == 1, run.text
    assert f"{bad}: CORRUPT" in run.out
    assert run.out.splitlines()[-1] == "verify: 3 checked: 2 OK, 1 CORRUPT, 0 ERROR"
    assert "verify: 3 checked" in zckpt("verify", "--quiet", root).out
    assert str(root / "one.zckpt") not in zckpt("verify", "--quiet", root).out


def test_verify_a_folder_without_containers(pair, zckpt, tmp_path):
    (tmp_path / "empty").mkdir()
    run = zckpt("verify", tmp_path / "empty")
    assert run.rc == 2 and "no zckpt container below this folder" in run.err, run.text


def test_verify_a_pt_hints_to_convert(pair, zckpt):
    run = zckpt("verify", pair[0])
    assert run.rc == 2
    assert f"hint: {pair[0]} is a torch.save (zip) file, not a zckpt container: convert it first" in run.err, run.err


# ---- no-clobber ------------------------------------------------------------------------------

def test_convert_and_export_never_overwrite_without_force(pair, zckpt, tmp_path):
    pt, zc = pair
    dst = tmp_path / "x.zckpt"
    dst.write_bytes(b"precious")
    run = zckpt("convert", pt, "-o", dst)
    assert run.rc == 2 and "exists" in run.err and "--force" in run.err, run.text
    assert dst.read_bytes() == b"precious"
    zckpt.ok("convert", "--quiet", "--force", pt, "-o", dst)
    zckpt.ok("verify", dst)

    back = tmp_path / "back.pt"
    back.write_bytes(b"precious")
    run = zckpt("export", zc, "-o", back)
    assert run.rc == 2 and "exists" in run.err, run.text
    assert back.read_bytes() == b"precious"
    zckpt.ok("export", "-f", zc, "-o", back)
    assert torch.equal(torch.load(back)["b"], torch.ones(3))
    # A dangling symlink is something at the destination too.
    link = tmp_path / "link.zckpt"
    os.symlink(tmp_path / "nowhere", link)
    assert zckpt("convert", pt, "-o", link).rc == 2


def test_folder_convert_checks_every_destination_first(pair, zckpt, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        shutil.copy(pair[0], src / f"m{i}.pt")
    (src / "notes.txt").write_text("x")
    out = tmp_path / "out"
    out.mkdir()
    (out / "m1.zckpt").write_bytes(b"old")
    run = zckpt("convert", src, "-o", out)
    assert run.rc == 2 and f"{out / 'm1.zckpt'} exists" in run.err, run.text
    assert sorted(os.listdir(out)) == ["m1.zckpt"]  # nothing else written
    zckpt.ok("convert", "--quiet", "--force", src, "-o", out)
    assert sorted(os.listdir(out)) == ["m0.zckpt", "m1.zckpt", "m2.zckpt", "notes.txt"]
    zckpt.ok("verify", out)


# ---- progress --------------------------------------------------------------------------------

def test_progress_always_writes_lines_for_logs(pair, zckpt, tmp_path):
    pt, zc = pair
    run = zckpt.ok("convert", "--progress", "always", pt, "-o", tmp_path / "x.zckpt")
    lines = run.err.splitlines()
    assert lines, "no progress in the log"
    assert all(re.fullmatch(rf"convert {re.escape(str(pt))}: \d+% \(.* of .*, .*/s\)", line) for line in lines), lines
    assert lines[-1].startswith(f"convert {pt}: 100% ")
    assert "\r" not in run.err and "\x1b" not in run.err
    percents = [int(re.search(r": (\d+)%", line).group(1)) for line in lines]
    assert percents == sorted(set(percents))  # each step once, rising
    run = zckpt.ok("verify", "--progress", "always", zc)
    assert run.err.splitlines()[-1].startswith(f"verify {zc}: 100% ")


def test_progress_never_and_auto_off_a_terminal(pair, zckpt, tmp_path):
    pt, _ = pair
    for mode in ("never", "auto"):
        run = zckpt.ok("convert", "--quiet", "--progress", mode, pt, "-o", tmp_path / f"{mode}.zckpt")
        assert run.err == "", (mode, run.err)
    run = zckpt("convert", "--progress", "sometimes", pt, "-o", tmp_path / "x.zckpt")
    assert run.rc == 2 and "--progress takes auto, always or never" in run.err
    assert not (tmp_path / "x.zckpt").exists()


def test_progress_from_the_environment(pair, zckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("ZCKPT_PROGRESS", "always")
    run = zckpt.ok("convert", "--quiet", pair[0], "-o", tmp_path / "x.zckpt")
    assert "100%" in run.err
    run = zckpt.ok("convert", "--quiet", "--progress", "never", pair[0], "-o", tmp_path / "y.zckpt")
    assert run.err == ""


def test_progress_lines_in_a_parallel_folder_convert(pair, zckpt, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        shutil.copy(pair[0], src / f"m{i}.pt")
    run = zckpt.ok("convert", "--quiet", "--progress", "always", "-j", "2", src, "-o", tmp_path / "out")
    done = sorted(line.split(":")[0] for line in run.err.splitlines() if ": 100% " in line)
    assert done == [f"convert {src / f'm{i}.pt'}" for i in range(3)], run.err


def test_a_failed_conversion_does_not_end_at_100_percent(zckpt, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x80\x02cos\nsystem\n.")
    run = zckpt("convert", "--progress", "always", bad, "-o", tmp_path / "x.zckpt")
    assert run.rc in (1, 2) and "100%" not in run.err, run.text


# ---- hints -----------------------------------------------------------------------------------

def test_convert_of_a_container_says_so(pair, zckpt, tmp_path):
    run = zckpt("convert", pair[1], "-o", tmp_path / "y.zckpt")
    assert run.rc == 2 and "already a zckpt container" in run.err, run.text
    assert_nothing_written(tmp_path, "convert of a container")


def test_load_of_a_pt_says_convert_first(pair, zckpt):
    run = zckpt("load", pair[0])
    assert run.rc == 2, run.text
    assert f"convert it first with `zckpt convert {pair[0]}`" in run.err, run.err


def test_zckpt_load_of_a_pt_says_convert_first(pair):
    zckpt_py = pytest.importorskip("zckpt")
    with pytest.raises(zckpt_py.ZckptError, match=r"torch.save \(zip\) file, not a zckpt container: convert it first"):
        zckpt_py.load(pair[0])
    with pytest.raises(zckpt_py.ZckptError, match="convert it first"):
        zckpt_py.load_into(pair[0], {"w": torch.zeros(300000)})
