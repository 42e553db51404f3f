"""`zckpt convert DIR -o OUTDIR [-j N]` on a verl-like checkpoint folder, and destinations that
must not overwrite what they read."""
from __future__ import annotations

import filecmp
import os
import shutil

import pytest
import torch

from conftest import rewrite_zip, torch_family
from torch_family import assert_deep_equal

RANKS = 2
PT_FILES = sorted(f"{kind}_world_size_{RANKS}_rank_{r}.pt" for kind in ("model", "optim", "extra_state")
                  for r in range(RANKS))
OTHER_FILES = ["fsdp_config.json", os.path.join("huggingface", "config.json")]

_NO_DTENSOR = torch_family.BY_NAME["model_world_size_1_rank_0.pt"].needs()
pytestmark = pytest.mark.skipif(bool(_NO_DTENSOR), reason=str(_NO_DTENSOR))


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.fixture(scope="module")
def actor(tmp_path_factory):
    """global_step_1/actor/ with model/optim/extra_state for 2 ranks, fsdp_config.json and
    huggingface/config.json."""
    root = tmp_path_factory.mktemp("verl")
    actor = torch_family.write_verl_folder(str(root), world_size=RANKS, step=1)
    assert tree(actor) == sorted(PT_FILES + OTHER_FILES)
    return actor


def zckpt_name(pt):
    return pt[: -len(".pt")] + ".zckpt"


@pytest.fixture(scope="module")
def converted_actor(actor, zckpt, tmp_path_factory):
    """`zckpt convert actor -o OUT -j 2`: (run, OUT)."""
    out = tmp_path_factory.mktemp("converted") / "global_step_1" / "actor"
    return zckpt.ok("convert", actor, "-o", out, "-j", "2"), out


def test_folder_mode_converts_every_pt_and_copies_the_rest(actor, converted_actor, zckpt, tmp_path):
    run, out = converted_actor
    assert tree(out) == sorted([zckpt_name(p) for p in PT_FILES] + OTHER_FILES)
    for other in OTHER_FILES:
        assert filecmp.cmp(os.path.join(actor, other), out / other, shallow=False), other
        assert f"{os.path.join(actor, other)} -> {out / other} (copied)" in run.out
    assert len(run.out.splitlines()) == len(PT_FILES) + len(OTHER_FILES)
    zckpt.ok("verify", *(out / zckpt_name(pt) for pt in PT_FILES))
    for pt in PT_FILES:
        src, dst = os.path.join(actor, pt), out / zckpt_name(pt)
        assert f"{src} -> {dst}: zip " in run.out
        back = tmp_path / pt
        zckpt.ok("export", dst, "-o", back)
        assert_deep_equal(torch.load(back, weights_only=False), torch.load(src, weights_only=False))


def test_folder_mode_ls_shows_rank_shards(converted_actor, zckpt):
    out = converted_actor[1]
    for r in range(RANKS):
        model = {t["name"]: t for t in zckpt.ls(out / f"model_world_size_{RANKS}_rank_{r}.zckpt")["tensors"]}
        assert model["lm_head.weight"]["extra"]["placements"] == [{"type": "Shard", "dim": 0}]
        optim = {t["name"]: t for t in zckpt.ls(out / f"optim_world_size_{RANKS}_rank_{r}.zckpt")["tensors"]}
        assert optim["state.0.exp_avg"]["flags"] == "dtensor"
        extra = {t["name"]: t for t in zckpt.ls(out / f"extra_state_world_size_{RANKS}_rank_{r}.zckpt")["tensors"]}
        assert extra["rng.cpu"]["dtype"] == "uint8" and extra["rng.cuda"]["shape"] == [16]


def test_only_pt_skips_other_files(actor, zckpt, tmp_path):
    out = tmp_path / "out"
    zckpt.ok("convert", "--quiet", "--only-pt", actor, "-o", out, "-j", "2")
    assert tree(out) == sorted(zckpt_name(p) for p in PT_FILES)


def test_folder_with_a_bad_file(actor, zckpt, tmp_path):
    """One unsafe shard: exit 1 naming it, nothing written for it, the others converted."""
    src = tmp_path / "src"
    shutil.copytree(actor, src)
    bad = src / PT_FILES[0]
    rewrite_zip(os.path.join(actor, PT_FILES[0]), bad,
                replace={"data.pkl": b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00echo\x85R."})
    out = tmp_path / "out"
    run = zckpt("convert", "--quiet", src, "-o", out, "-j", "2")
    assert run.rc == 1, run.text
    assert f"{bad}: refused global 'os.system' at pickle byte offset 2" in run.err
    assert tree(out) == sorted([zckpt_name(p) for p in PT_FILES[1:]] + OTHER_FILES)


def test_folder_needs_output(actor, zckpt):
    run = zckpt("convert", actor)
    assert run.rc == 2 and "-o" in run.err


def test_empty_folder(zckpt, tmp_path):
    # Exit 0 with nothing written would read as a conversion (verify of it exits 2).
    (tmp_path / "empty").mkdir()
    run = zckpt("convert", tmp_path / "empty", "-o", tmp_path / "out")
    assert run.rc == 2 and "an empty folder" in run.err, run.text
    assert not (tmp_path / "out").exists()


def test_folder_names_that_collide_lose_nothing(family, zckpt, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(family["strides.pt"].path, src / "model.pt")
    shutil.copy(family["dtypes.pt"].path, src / "model.bin")
    out = tmp_path / "out"
    run = zckpt("convert", "--quiet", src, "-o", out, "-j", "2")
    if run.rc != 0:  # refusing is fine if it says why
        assert "model.pt" in run.err and "model.bin" in run.err, run.text
        return
    outputs = tree(out)
    assert len(outputs) == 2, f"two sources, outputs {outputs}"
    for name in outputs:
        zckpt.ok("verify", out / name)


# ---- destinations that are the source -------------------------------------------------------

@pytest.mark.parametrize("source,destination", [
    ("model.pt", "model.pt"),
    ("model.pt", "./model.pt"),
    ("model.pt", "{abs}/model.pt"),
    ("link.pt", "model.pt"),
])
def test_convert_never_overwrites_its_source(source, destination, family, zckpt, tmp_path):
    src = tmp_path / "model.pt"
    shutil.copy(family["strides.pt"].path, src)
    os.symlink("model.pt", tmp_path / "link.pt")
    before = src.read_bytes()
    run = zckpt("convert", "--quiet", source, "-o", destination.format(abs=tmp_path), cwd=tmp_path)
    assert src.read_bytes() == before, "the source .pt was replaced"
    assert run.rc == 2, run.text


def test_export_never_overwrites_its_source(converted, zckpt, tmp_path):
    src = tmp_path / "model.zckpt"
    shutil.copy(converted["strides.pt"][1], src)
    before = src.read_bytes()
    run = zckpt("export", "model.zckpt", "-o", "./model.zckpt", cwd=tmp_path)
    assert src.read_bytes() == before, "the source container was replaced"
    assert run.rc == 2, run.text
