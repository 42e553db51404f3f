"""Checkpoints in formats zckpt does not convert are named for what they are, never taken for a
corrupt .pt nor copied as if they were plain files: a torch.distributed.checkpoint folder (written
here by torch.distributed.checkpoint itself) or one of its .distcp files, a TorchScript archive,
a GGUF file, numpy .npz/.npy files, and a file that already is a container. Each is refused with
exit 2 and a message saying what it is; a folder holding any stops before writing anything
unless --copy-unknown copies them."""
from __future__ import annotations

import filecmp
import os
import shutil
import struct
import subprocess
import sys
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
    "dcp": "is a torch.distributed.checkpoint (DCP) folder",
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
    args = ["-o", tmp_path / "out"] if kind == "dcp" else ["-o", tmp_path / "out.zckpt"]
    run = zckpt("convert", foreign[kind], *args)
    assert run.rc == 2, run.text
    assert MESSAGES[kind] in run.err, run.err
    assert "corrupt" not in run.err.lower(), run.err
    assert_nothing_written(tmp_path, kind)
    if kind.startswith("dcp") or kind == "distcp":
        # What to use instead, naming the folder.
        assert f"format_utils dcp_to_torch {foreign['dcp']} model.pt" in run.err, run.err


def test_the_dcp_advice_works(foreign, zckpt, tmp_path):
    """The command the message gives writes a torch.save file zckpt converts."""
    pt = tmp_path / "model.pt"
    subprocess.run([sys.executable, "-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch",
                    foreign["dcp"], pt], check=True, capture_output=True)
    zckpt.ok("convert", "--quiet", pt)
    import zckpt as zckpt_py

    got = zckpt_py.load(tmp_path / "model.zckpt")
    assert torch.equal(got["w"], torch.arange(12, dtype=torch.float32).reshape(3, 4))


def test_a_folder_holding_them_stops_before_writing(foreign, zckpt, tmp_path):
    src = tmp_path / "ckpt"
    (src / "actor").mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, src / "actor" / "model.pt")
    (src / "config.json").write_text("{}")
    shutil.copytree(foreign["dcp"], src / "actor" / "dcp")
    for kind in ("torchscript", "gguf", "npz"):
        shutil.copy(foreign[kind], src / foreign[kind].name)
    out = tmp_path / "out"
    run = zckpt("convert", src, "-o", out)
    assert run.rc == 2, run.text
    assert not out.exists(), "something was written"
    assert f"{src / 'actor' / 'dcp'}: a torch.distributed.checkpoint (DCP) folder" in run.err
    for kind in ("torchscript", "gguf", "npz"):
        assert f"{src / foreign[kind].name}: {MESSAGES[kind]}" in run.err, run.err
    assert "5 files are checkpoints in a format zckpt does not convert" in run.err, run.err
    assert "--copy-unknown" in run.err

    run = zckpt.ok("convert", "--copy-unknown", src, "-o", out)
    assert (out / "actor" / "model.zckpt").exists()
    for rel in ["config.json", "actor/dcp/.metadata", *(foreign[k].name for k in ("torchscript", "gguf", "npz"))]:
        assert filecmp.cmp(src / rel, out / rel, shallow=False), rel
    assert "(copied, not converted: TorchScript archive)" in run.out, run.out


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
