"""Checkpoints in formats zckpt does not convert are named for what they are, never taken for a
corrupt .pt nor copied as if they were plain files: a TorchScript archive, a GGUF file, numpy
.npz/.npy files, a file that already is a container, and one file of a torch.distributed.checkpoint
folder (written here by torch.distributed.checkpoint itself) given alone. Each is refused with
exit 2 and a message saying what it is; a folder holding any stops before writing anything
unless --copy-unknown copies them. A DCP folder itself converts as one checkpoint (as the folder
converted or below it) under the same rules as any destination: no-clobber, --force, --progress;
verify DIR takes it as one entry among containers."""
from __future__ import annotations

import filecmp
import os
import re
import shutil
import struct
import subprocess
import warnings
import zipfile

import numpy as np
import pytest
import torch

from conftest import assert_nothing_written

warnings.simplefilter("ignore")


def write_dcp(folder):
    import torch.distributed.checkpoint as dcp

    # Single process, no process group: what a user's own script can do.
    dcp.save({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(3)},
             checkpoint_id=str(folder), no_dist=True)
    names = sorted(os.listdir(folder))
    assert ".metadata" in names and any(n.endswith(".distcp") for n in names), names
    return names


def gguf_header():
    # GGUF v3: magic, version, tensor count, metadata key/value count (llama.cpp's gguf.h).
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 0)


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """{kind: path} of one file of each format, and the DCP folder."""
    root = tmp_path_factory.mktemp("foreign")
    out = {"dcp": root / "dcp"}
    write_dcp(out["dcp"])
    out["distcp"] = next(out["dcp"].glob("*.distcp"))
    out["dcp_metadata"] = out["dcp"] / ".metadata"
    out["torchscript"] = root / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), out["torchscript"])
    out["gguf"] = root / "model.gguf"
    out["gguf"].write_bytes(gguf_header())
    out["npz"] = root / "arrays.npz"
    np.savez(out["npz"], a=np.arange(3), b=np.ones((2, 2)))
    out["npy"] = root / "array.npy"
    np.save(out["npy"], np.arange(4))
    pt = root / "plain.pt"
    torch.save({"w": torch.ones(2)}, pt)
    out["zckpt"] = root / "already.zckpt"
    subprocess.run([os.environ.get("ZCKPT_BIN") or "zckpt", "convert", "-q", pt, "-o", out["zckpt"]], check=False)
    return out


MESSAGES = {
    "distcp": "a shard of a torch.distributed.checkpoint (DCP) folder",
    "dcp_metadata": "the .metadata of a torch.distributed.checkpoint (DCP) folder",
    "torchscript": "a TorchScript archive (torch.jit.save)",
    "gguf": "a GGUF file",
    "npz": "a numpy .npz archive",
    "npy": "a numpy .npy file",
    "zckpt": "already a zckpt container",
}


@pytest.mark.parametrize("kind", list(MESSAGES))
def test_each_is_named_and_refused_with_exit_2(kind, foreign, zckpt, tmp_path):
    if kind == "zckpt":
        zckpt.ok("verify", foreign["zckpt"])
    run = zckpt("convert", foreign[kind], "-o", tmp_path / "out.zckpt")
    assert run.rc == 2, run.text
    assert MESSAGES[kind] in run.err, run.err
    assert "corrupt" not in run.err.lower(), run.err
    assert_nothing_written(tmp_path, kind)
    if kind in ("distcp", "dcp_metadata"):
        # What to do instead: the folder is the checkpoint.
        assert f"`zckpt convert {foreign['dcp']} -o OUTDIR` converts it as a whole" in run.err, run.err


W = torch.arange(12, dtype=torch.float32).reshape(3, 4)


def test_a_dcp_folder_converts_instead_of_being_refused(foreign, zckpt, tmp_path):
    """What issue 15 refused (exit 2, "use dcp_to_torch_save") now converts: containers that
    verify, load through zckpt.dcp.ZckptStorageReader, and export back byte for byte."""
    out = tmp_path / "out"
    run = zckpt.ok("convert", foreign["dcp"], "-o", out)
    assert "DCP checkpoint, 1 .distcp files -> containers" in run.out, run.out
    assert sorted(os.listdir(out)) == [".metadata", "__0_0.zckpt"]
    assert "DCP checkpoint: 2 tensor pieces" in zckpt.ok("verify", out).out
    zckpt.ok("export", out, "-o", tmp_path / "back")
    for name in os.listdir(foreign["dcp"]):
        assert filecmp.cmp(foreign["dcp"] / name, tmp_path / "back" / name, shallow=False), name
    import torch.distributed.checkpoint as dcp
    import zckpt.dcp as zdcp

    state = {"w": torch.zeros(3, 4), "b": torch.zeros(3)}
    dcp.load(state, storage_reader=zdcp.ZckptStorageReader(str(out)), no_dist=True)
    assert torch.equal(state["w"], W) and torch.equal(state["b"], torch.ones(3))


def test_the_dcp_advice_works(foreign, zckpt, tmp_path):
    """The commands the message of a lone .distcp gives: convert the folder, or merge it."""
    run = zckpt("convert", foreign["distcp"], "-o", tmp_path / "x.zckpt")
    assert run.rc == 2 and f"`zckpt merge {foreign['dcp']} -o OUT` writes the full model" in run.err, run.err
    zckpt.ok("merge", "--quiet", foreign["dcp"], "-o", tmp_path / "model.zckpt")
    import zckpt as zckpt_py

    got = zckpt_py.load(tmp_path / "model.zckpt")
    assert torch.equal(got["w"], W) and torch.equal(got["b"], torch.ones(3))


def test_a_folder_holding_them_stops_before_writing(foreign, zckpt, tmp_path):
    src = tmp_path / "ckpt"
    (src / "actor").mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, src / "actor" / "model.pt")
    (src / "config.json").write_text("{}")
    shutil.copytree(foreign["dcp"], src / "actor" / "dcp")  # a DCP folder: converted, not foreign
    shutil.copy(foreign["distcp"], src / "stray.distcp")  # a shard without its folder: foreign
    for kind in ("torchscript", "gguf", "npz"):
        shutil.copy(foreign[kind], src / foreign[kind].name)
    out = tmp_path / "out"
    run = zckpt("convert", src, "-o", out)
    assert run.rc == 2, run.text
    assert not out.exists(), "something was written"
    assert "actor/dcp" not in run.err, run.err
    assert f"{src / 'stray.distcp'}: {MESSAGES['distcp']}" in run.err, run.err
    for kind in ("torchscript", "gguf", "npz"):
        assert f"{src / foreign[kind].name}: {MESSAGES[kind]}" in run.err, run.err
    assert "4 files are checkpoints in a format zckpt does not convert" in run.err, run.err
    assert "--copy-unknown" in run.err

    run = zckpt.ok("convert", "--copy-unknown", src, "-o", out)
    assert (out / "actor" / "model.zckpt").exists()
    assert sorted(os.listdir(out / "actor" / "dcp")) == [".metadata", "__0_0.zckpt"]
    assert f"{src / 'actor' / 'dcp'} -> {out / 'actor' / 'dcp'}: DCP checkpoint" in run.out, run.out
    for rel in ["config.json", "actor/dcp/.metadata", "stray.distcp", *(foreign[k].name for k in ("torchscript", "gguf", "npz"))]:
        assert filecmp.cmp(src / rel, out / rel, shallow=False), rel
    assert "(copied, not converted: TorchScript archive)" in run.out, run.out
    # verify DIR: the containers and the DCP folder, one line each.
    run = zckpt.ok("verify", out)
    assert f"{out / 'actor' / 'dcp'}: OK (DCP checkpoint: 2 tensor pieces" in run.out, run.out
    assert run.out.splitlines()[-1] == "verify: 2 checked: 2 OK, 0 CORRUPT, 0 ERROR", run.out


def test_plain_files_that_look_odd_are_copied(zckpt, tmp_path):
    """A zip that is not a checkpoint, a `.metadata` outside a DCP folder, a container: copied."""
    src = tmp_path / "src"
    src.mkdir()
    with zipfile.ZipFile(src / "assets.zip", "w") as z:
        z.writestr("readme.txt", "hello")
    (src / ".metadata").write_bytes(b"\x80\x04not dcp")
    torch.save({"w": torch.ones(2)}, src / "model.pt")
    out = tmp_path / "out"
    zckpt.ok("convert", "--quiet", src, "-o", out)
    assert sorted(os.listdir(out)) == [".metadata", "assets.zip", "model.zckpt"]
    run = zckpt("convert", src / ".metadata", "-o", tmp_path / "m.zckpt")
    assert run.rc == 2 and "not a torch.save file" in run.err and "distributed" not in run.err, run.text
    zckpt.ok("convert", "--quiet", out, "-o", tmp_path / "again")  # a container in a folder: copied
    assert filecmp.cmp(out / "model.zckpt", tmp_path / "again" / "model.zckpt", shallow=False)


def test_a_distcp_file_is_not_reported_corrupt(foreign, zckpt, tmp_path):
    """It starts like a torch.save zip; the name says what it is before the zip reader does."""
    dst = tmp_path / "x.distcp"
    shutil.copy(foreign["distcp"], dst)
    run = zckpt("convert", dst)
    assert run.rc == 2 and "torch.distributed.checkpoint" in run.err, run.text


# ---- DCP folders under the CLI's rules (no-clobber, --force, --progress, verify DIR) ----------

def test_dcp_convert_export_and_merge_never_overwrite_without_force(foreign, zckpt, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "__0_0.zckpt").write_bytes(b"precious")
    run = zckpt("convert", foreign["dcp"], "-o", out)
    assert run.rc == 2 and f"{out / '__0_0.zckpt'} exists" in run.err and "--force" in run.err, run.text
    assert sorted(os.listdir(out)) == ["__0_0.zckpt"] and (out / "__0_0.zckpt").read_bytes() == b"precious"
    zckpt.ok("convert", "--quiet", "--force", foreign["dcp"], "-o", out)
    zckpt.ok("verify", out)

    back = tmp_path / "back"
    back.mkdir()
    (back / ".metadata").write_bytes(b"precious")
    run = zckpt("export", out, "-o", back)
    assert run.rc == 2 and f"{back / '.metadata'} exists" in run.err, run.text
    assert sorted(os.listdir(back)) == [".metadata"]
    zckpt.ok("export", "-f", out, "-o", back)
    assert filecmp.cmp(foreign["dcp"] / "__0_0.distcp", back / "__0_0.distcp", shallow=False)
    run = zckpt("export", "--format", "safetensors", out, "-o", tmp_path / "st")
    assert run.rc == 2 and "zckpt merge" in run.err, run.text

    merged = tmp_path / "m.zckpt"
    merged.write_bytes(b"precious")
    run = zckpt("merge", foreign["dcp"], "-o", merged)
    assert run.rc == 2 and "exists" in run.err and "--force" in run.err, run.text
    assert merged.read_bytes() == b"precious"
    zckpt.ok("merge", "-q", "-f", foreign["dcp"], "-o", merged)
    zckpt.ok("verify", merged)
    hf = tmp_path / "hf"
    zckpt.ok("merge", "-q", foreign["dcp"], "-o", hf)
    run = zckpt("merge", foreign["dcp"], "-o", hf)
    assert run.rc == 2 and "model.safetensors" in run.err, run.text


def test_a_folder_convert_checks_the_dcp_folders_destinations_too(foreign, zckpt, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(foreign["dcp"], src / "dcp")
    torch.save({"w": torch.ones(2)}, src / "model.pt")
    out = tmp_path / "out"
    (out / "dcp").mkdir(parents=True)
    (out / "dcp" / ".metadata").write_bytes(b"old")
    run = zckpt("convert", src, "-o", out)
    assert run.rc == 2 and f"{out / 'dcp' / '.metadata'} exists" in run.err, run.text
    assert sorted(os.listdir(out)) == ["dcp"] and sorted(os.listdir(out / "dcp")) == [".metadata"]


def test_dcp_progress_lines_for_logs(foreign, zckpt, tmp_path):
    run = zckpt.ok("convert", "--quiet", "--progress", "always", foreign["dcp"], "-o", tmp_path / "out")
    lines = run.err.splitlines()
    assert lines and all(re.fullmatch(rf"convert {re.escape(str(foreign['dcp']))}: \d+% \(.* of .*, .*/s\)", l)
                         for l in lines), lines
    assert lines[-1].startswith(f"convert {foreign['dcp']}: 100% ")
    run = zckpt.ok("verify", "--progress", "always", tmp_path / "out")
    assert run.err.splitlines()[-1].startswith(f"verify {tmp_path / 'out'}: 100% "), run.err
    run = zckpt.ok("merge", "--quiet", "--progress", "always", foreign["dcp"], "-o", tmp_path / "m.zckpt")
    assert run.err.splitlines()[-1].startswith(f"merge {foreign['dcp']}: 100% "), run.err
    assert zckpt.ok("convert", "--quiet", "--progress", "never", foreign["dcp"], "-o", tmp_path / "o2").err == ""


def test_verify_dir_with_a_corrupt_dcp_folder_among_containers(foreign, zckpt, tmp_path):
    root = tmp_path / "root"
    zckpt.ok("convert", "--quiet", foreign["dcp"], "-o", root / "dcp")
    shutil.copy(foreign["zckpt"], root / "model.zckpt")
    run = zckpt.ok("verify", "--json", root)
    entries = {os.path.relpath(e["file"], root): e for e in run.json()}
    assert set(entries) == {"dcp", "model.zckpt"} and entries["dcp"]["kind"] == "dcp", entries
    assert all(e["status"] == "ok" for e in entries.values())
    # A flipped byte in the DCP folder's container: that entry is CORRUPT, the summary says so.
    c = root / "dcp" / "__0_0.zckpt"
    data = bytearray(c.read_bytes())
    storage = zckpt.ls(c)["storages"][0]
    data[storage["offset"]] ^= 0xFF
    c.write_bytes(bytes(data))
    run = zckpt("verify", root)
    assert run.rc == 1, run.text
    assert f"{root / 'dcp'}: CORRUPT" in run.out and f"{root / 'model.zckpt'}: OK" in run.out, run.out
    assert run.out.splitlines()[-1] == "verify: 2 checked: 1 OK, 1 CORRUPT, 0 ERROR", run.out
    assert "__0_0.zckpt" in run.err, run.err


def test_zckpts_own_dcp_layout(zckpt, tmp_path):
    """A folder ZckptStorageWriter wrote: verify takes it whole; convert says it is zckpt's layout
    already (exit 2); below a folder being converted it is copied like any containers."""
    import torch.distributed.checkpoint as dcp
    import zckpt.dcp as zdcp

    src = tmp_path / "src"
    dcp.save({"w": W}, storage_writer=zdcp.ZckptStorageWriter(str(src / "step")), no_dist=True)
    assert "DCP checkpoint: 1 tensor pieces" in zckpt.ok("verify", src / "step").out
    run = zckpt("convert", src / "step", "-o", tmp_path / "x")
    assert run.rc == 2 and "already zckpt's DCP layout" in run.err, run.text
    zckpt.ok("convert", "--quiet", src, "-o", tmp_path / "out")
    for name in os.listdir(src / "step"):
        assert filecmp.cmp(src / "step" / name, tmp_path / "out" / "step" / name, shallow=False), name


def test_dcp_items_and_rank_files_are_read_under_the_allowlist(zckpt, tmp_path):
    """A non-tensor DCP item is unpickled by DCP's planner without weights_only: convert, export
    and ZckptStorageReader read it under zckpt's allowlist first (a harmless global off it is
    refused until allowed by name); verify reads it under the deny list only, as it reads object
    pickles. merge reads a verl rank file's pickle under the allowlist too."""
    from fractions import Fraction

    import torch.distributed.checkpoint as dcp
    import zckpt.dcp as zdcp
    from torch.distributed.checkpoint.api import CheckpointException

    fs, out, back = tmp_path / "fs", tmp_path / "out", tmp_path / "back"
    dcp.save({"w": W, "frac": Fraction(1, 3)}, checkpoint_id=str(fs), no_dist=True)
    zckpt.ok("verify", fs)
    run = zckpt("convert", fs, "-o", out)
    assert run.rc == 1 and "refused global 'fractions.Fraction'" in run.err, run.text
    assert not (out / "__0_0.zckpt").exists()
    zckpt.ok("convert", "--quiet", "--allow-global", "fractions.Fraction", fs, "-o", out)
    zckpt.ok("verify", out)

    run = zckpt("export", out, "-o", back)
    assert run.rc == 1 and "refused global 'fractions.Fraction'" in run.err, run.text
    assert not back.exists() or not os.listdir(back)
    zckpt.ok("export", "--allow-global", "fractions.Fraction", out, "-o", back)
    assert filecmp.cmp(fs / "__0_0.distcp", back / "__0_0.distcp", shallow=False)

    state = {"w": torch.zeros(3, 4), "frac": None}
    with pytest.raises(CheckpointException, match="refused global 'fractions.Fraction'"):
        dcp.load(state, storage_reader=zdcp.ZckptStorageReader(str(out)), no_dist=True)
    dcp.load(state, storage_reader=zdcp.ZckptStorageReader(str(out), allow_globals=[Fraction]), no_dist=True)
    assert state["frac"] == Fraction(1, 3) and torch.equal(state["w"], W)

    verl = tmp_path / "verl"
    verl.mkdir()
    torch.save({"w": W, "meta": Fraction(1, 3)}, verl / "model_world_size_1_rank_0.pt")
    run = zckpt("merge", verl, "-o", tmp_path / "m.zckpt")
    assert run.rc == 1 and "refused global 'fractions.Fraction'" in run.err, run.text
    assert not (tmp_path / "m.zckpt").exists()
    zckpt.ok("merge", "-q", "--allow-global", "fractions.Fraction", verl, "-o", tmp_path / "m.zckpt")
    import zckpt as zckpt_py

    assert torch.equal(zckpt_py.load(tmp_path / "m.zckpt")["w"], W)
