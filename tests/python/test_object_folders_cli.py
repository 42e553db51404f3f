"""Folders in S3-compatible object storage for the command-line tool (issue 25): `zckpt verify`,
`merge`, `convert -o` and `export` take s3://BUCKET/PREFIX/ where they take a local folder.
Every case runs the same command on a local copy and compares: files written by torch and
safetensors here, uploaded to a moto server on localhost (tests/python/s3_server.py)."""
import json
import os
import pathlib

import pytest
import torch

import s3_server
import zckpt
import zckpt.dcp
import zckpt_testing
from zckpt_testing import run_cli

BUCKET = "folders"


@pytest.fixture(scope="module")
def moto():
    yield from s3_server.serve_moto(BUCKET)


@pytest.fixture
def s3env(moto, monkeypatch):
    """zckpt pointed at moto (path-style, fixed test keys), short retries; pages of 2 keys, so a
    listing takes several ListObjectsV2 pages."""
    return s3_server.point_zckpt_at(monkeypatch, moto.url, ZCKPT_S3_ATTEMPTS="2", ZCKPT_S3_TIMEOUT="5",
                                    ZCKPT_S3_LIST_KEYS="2")


@pytest.fixture
def prefix(request):
    """A key prefix of this test's own."""
    return request.node.name.replace("[", "_").replace("]", "_")


def upload(moto, local, prefix):
    """Every file below `local` as BUCKET/PREFIX/RELATIVE; the folder's URL."""
    local = pathlib.Path(local)
    for f in sorted(local.rglob("*")):
        if f.is_file():
            moto.put(BUCKET, f"{prefix}/{f.relative_to(local).as_posix()}", f.read_bytes())
    return f"s3://{BUCKET}/{prefix}/"


def download(moto, prefix, local):
    """Every object under BUCKET/PREFIX/ into `local` by its relative name; the names."""
    local = pathlib.Path(local)
    names = []
    for key in moto.keys(BUCKET):
        if not key.startswith(prefix + "/"):
            continue
        name = key[len(prefix) + 1:]
        status, body = moto.get(BUCKET, key)
        assert status == 200, key
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(body)
        names.append(name)
    return sorted(names)


def tree(folder):
    folder = pathlib.Path(folder)
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def hf_model(folder):
    """A sharded Hugging Face folder: two safetensors shards, their index, config and tokenizer."""
    from safetensors.torch import save_file

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(7)
    shards = [
        {"model.embed.weight": torch.randn(64, 32, generator=g), "model.norm.weight": torch.ones(32)},
        {"lm_head.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16)},
    ]
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    (folder / "config.json").write_text('{"model_type": "toy"}')
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    return {k: v for s in shards for k, v in s.items()}


def verl_model(folder, world=2):
    """verl's per-rank files (plain tensors: every rank holds all of each) and its huggingface/."""
    folder = pathlib.Path(folder)
    (folder / "huggingface").mkdir(parents=True)
    g = torch.Generator().manual_seed(3)
    state = {"w": torch.randn(40, 8, generator=g), "b": torch.arange(8.0)}
    for r in range(world):
        torch.save(state, folder / f"model_world_size_{world}_rank_{r}.pt")
    (folder / "huggingface" / "config.json").write_text('{"model_type": "toy"}')
    return state


def verify_json(path):
    r = run_cli("verify", "--json", path)
    return r.returncode, json.loads(r.stdout)


def relative(report, root):
    """verify --json entries keyed by the path below `root`: {name: (status, kind)}."""
    root = str(root).rstrip("/") + "/"
    out = {}
    for e in report:
        assert e["file"].startswith(root), (e["file"], root)
        out[e["file"][len(root):]] = (e["status"], e.get("kind"))
    return out


def assert_tensors_equal(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def dcp_zckpt_folder(folder):
    import torch.distributed.checkpoint as dcp

    state = {"model": {"x": torch.arange(12.0).reshape(3, 4), "y": torch.ones(5, dtype=torch.float64)}}
    dcp.save(state, storage_writer=zckpt.dcp.ZckptStorageWriter(str(folder)), no_dist=True)
    return state


def test_verify_prefix_reports_as_the_local_folder_and_names_a_flipped_byte(s3env, moto, prefix, tmp_path):
    hf_model(tmp_path / "hf")
    local = tmp_path / "tree"
    assert run_cli("convert", tmp_path / "hf", "-o", local / "converted").returncode == 0
    dcp_zckpt_folder(local / "step_1" / "dcp")
    (local / "notes.txt").write_text("not a container")
    url = upload(moto, local, prefix)
    rc_local, rep_local = verify_json(local)
    rc_remote, rep_remote = verify_json(url)
    assert rc_local == 0 and rc_remote == 0, rep_remote
    assert relative(rep_remote, url) == relative(rep_local, local)
    assert relative(rep_remote, url) == {
        "converted/model-00001-of-00002.zckpt": ("ok", None),
        "converted/model-00002-of-00002.zckpt": ("ok", None),
        "step_1/dcp": ("ok", "dcp"),
    }
    # The same without the trailing '/', and the text report.
    assert relative(verify_json(url.rstrip("/"))[1], url) == relative(rep_local, local)
    text = run_cli("verify", url)
    assert text.returncode == 0 and "3 checked: 3 OK" in text.stdout, text.stdout + text.stderr

    # One byte flipped in the middle of one object: that file, exit 1; the others still OK.
    bad = "converted/model-00002-of-00002.zckpt"
    data = bytearray((local / bad).read_bytes())
    data[len(data) // 2] ^= 0x40
    moto.put(BUCKET, f"{prefix}/{bad}", bytes(data))
    rc, rep = verify_json(url)
    assert rc == 1, rep
    got = relative(rep, url)
    assert got[bad][0] == "corrupt" and got["converted/model-00001-of-00002.zckpt"][0] == "ok", got
    text = run_cli("verify", url)
    assert text.returncode == 1 and f"{url}{bad}: CORRUPT" in text.stdout, text.stdout + text.stderr
    assert f"{url}{bad}" in text.stderr


def test_verify_of_a_dcp_prefix_and_an_empty_one(s3env, moto, prefix, tmp_path):
    dcp_zckpt_folder(tmp_path / "dcp")
    url = upload(moto, tmp_path / "dcp", prefix)
    rc, rep = verify_json(url)
    assert rc == 0 and len(rep) == 1 and rep[0]["kind"] == "dcp" and rep[0]["status"] == "ok", rep
    assert rep[0]["file"] == url.rstrip("/")
    # A container of the DCP folder damaged: the folder is corrupt, the message names the object.
    name = sorted(p.name for p in (tmp_path / "dcp").glob("__*.zckpt"))[0]
    data = bytearray((tmp_path / "dcp" / name).read_bytes())
    data[len(data) // 2] ^= 1
    moto.put(BUCKET, f"{prefix}/{name}", bytes(data))
    r = run_cli("verify", url)
    assert r.returncode == 1 and url + name in r.stderr, r.stdout + r.stderr
    # Nothing under a prefix: exit 2, naming it.
    r = run_cli("verify", f"s3://{BUCKET}/{prefix}-nothing/")
    assert r.returncode == 2 and f"{prefix}-nothing" in r.stdout + r.stderr, r.stdout + r.stderr


def test_merge_verl_prefix_equals_the_local_merge(s3env, moto, prefix, tmp_path):
    from safetensors.torch import load_file

    state = verl_model(tmp_path / "verl")
    assert run_cli("convert", tmp_path / "verl", "-o", tmp_path / "z").returncode == 0
    url = upload(moto, tmp_path / "z", prefix + "/actor")
    r = run_cli("merge", tmp_path / "z", "-o", tmp_path / "hf_local")
    assert r.returncode == 0, r.stderr
    r = run_cli("merge", url, "-o", tmp_path / "hf_remote")
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree(tmp_path / "hf_remote") == tree(tmp_path / "hf_local")
    assert sorted(tree(tmp_path / "hf_remote")) == ["config.json", "model.safetensors"]
    assert_tensors_equal(load_file(str(tmp_path / "hf_remote" / "model.safetensors")), state)
    # Into a container, and into an object folder: the same bytes as the local merge.
    assert run_cli("merge", url.rstrip("/"), "-o", tmp_path / "m.zckpt").returncode == 0
    assert_tensors_equal(zckpt.load(str(tmp_path / "m.zckpt")), state)
    assert run_cli("merge", url, "-o", f"s3://{BUCKET}/{prefix}/m.zckpt").returncode == 0
    assert_tensors_equal(zckpt.load(f"s3://{BUCKET}/{prefix}/m.zckpt"), state)
    out = f"s3://{BUCKET}/{prefix}/merged/"
    r = run_cli("merge", url, "-o", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert download(moto, f"{prefix}/merged", tmp_path / "hf_s3") == ["config.json", "model.safetensors"]
    assert tree(tmp_path / "hf_s3") == tree(tmp_path / "hf_local")
    # An output that exists: refused without --force, naming it; replaced with it.
    r = run_cli("merge", url, "-o", out)
    assert r.returncode == 2 and out + "model.safetensors" in r.stderr, r.stderr
    assert run_cli("merge", url, "-o", out, "--force").returncode == 0


def test_merge_refuses_pt_rank_files_in_object_storage(s3env, moto, prefix, tmp_path):
    verl_model(tmp_path / "verl")
    url = upload(moto, tmp_path / "verl", prefix)
    r = run_cli("merge", url, "-o", tmp_path / "hf")
    assert r.returncode == 2, r.stdout + r.stderr
    assert url + "model_world_size_2_rank_0.pt" in r.stderr and "zckpt convert" in r.stderr, r.stderr
    assert not (tmp_path / "hf").exists()


def test_merge_dcp_prefix_equals_the_local_merge(s3env, moto, prefix, tmp_path):
    state = dcp_zckpt_folder(tmp_path / "dcp")
    url = upload(moto, tmp_path / "dcp", prefix)
    for src, out in ((tmp_path / "dcp", "local.zckpt"), (url, "remote.zckpt")):
        r = run_cli("merge", src, "-o", tmp_path / out, "--keys", "model.")
        assert r.returncode == 0, r.stdout + r.stderr
    assert_tensors_equal(zckpt.load(str(tmp_path / "remote.zckpt")), state["model"])
    assert_tensors_equal(zckpt.load(str(tmp_path / "remote.zckpt")), zckpt.load(str(tmp_path / "local.zckpt")))
    # A Hugging Face output with its config from an object folder (its weights not copied).
    moto.put(BUCKET, f"{prefix}-cfg/config.json", b'{"model_type": "toy"}')
    moto.put(BUCKET, f"{prefix}-cfg/model.safetensors", b"not copied")
    r = run_cli("merge", url, "-o", tmp_path / "hf", "--keys", "model.", "--hf-config", f"s3://{BUCKET}/{prefix}-cfg")
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree(tmp_path / "hf")["config.json"] == b'{"model_type": "toy"}'
    assert sorted(tree(tmp_path / "hf")) == ["config.json", "model.safetensors"]
    # A bucket that does not exist: exit 2, naming the URL.
    r = run_cli("merge", f"s3://no-such-bucket-{prefix.lower()[:20]}/x/", "-o", tmp_path / "none")
    assert r.returncode == 2 and "no-such-bucket" in r.stderr, r.stderr
    r = run_cli("verify", f"s3://no-such-bucket-{prefix.lower()[:20]}/x/")
    assert r.returncode == 2 and "no-such-bucket" in r.stdout + r.stderr, r.stdout + r.stderr


def test_convert_folder_to_a_prefix_equals_the_local_conversion(s3env, moto, prefix, tmp_path):
    tensors = hf_model(tmp_path / "hf")
    url = f"s3://{BUCKET}/{prefix}/"
    r = run_cli("convert", tmp_path / "hf", "-o", url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert run_cli("convert", tmp_path / "hf", "-o", tmp_path / "local").returncode == 0
    names = download(moto, prefix, tmp_path / "remote")
    assert names == sorted(tree(tmp_path / "local"))
    assert "model.zckpt.index.json" in names and "config.json" in names
    assert not pathlib.Path("s3:").exists() and not (tmp_path / "s3:").exists()  # no local folder named like the URL
    local, remote = tree(tmp_path / "local"), tree(tmp_path / "remote")
    for name in names:  # byte for byte: containers, the rewritten index, the copied files
        assert remote[name] == local[name], name
    got = {}
    for name in names:
        if name.endswith(".zckpt"):
            got.update(zckpt.load(str(tmp_path / "remote" / name)))
    assert_tensors_equal(got, tensors)
    assert run_cli("verify", url).returncode == 0

    # Again: every destination exists, nothing is written without --force; with it, all of it.
    moto.put(BUCKET, f"{prefix}/config.json", b"changed")
    r = run_cli("convert", tmp_path / "hf", "-o", url)
    assert r.returncode == 2 and url + "config.json exists" in r.stderr, r.stderr
    assert moto.get(BUCKET, f"{prefix}/config.json")[1] == b"changed"
    r = run_cli("convert", tmp_path / "hf", "-o", url, "--force")
    assert r.returncode == 0, r.stderr
    assert moto.get(BUCKET, f"{prefix}/config.json")[1] == local["config.json"]


def test_convert_a_filesystemwriter_folder_to_a_prefix_and_export_it_back(s3env, moto, prefix, tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.randn(16, 16), "b": torch.arange(9.0)}, "step": 4}, checkpoint_id=str(tmp_path / "fs"))
    url = f"s3://{BUCKET}/{prefix}/"
    r = run_cli("convert", tmp_path / "fs", "-o", url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert run_cli("verify", url).returncode == 0
    r = run_cli("export", url, "-o", tmp_path / "back")
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree(tmp_path / "back") == tree(tmp_path / "fs")  # .distcp files byte for byte, .metadata unchanged


def test_export_of_an_object_to_a_local_pt(s3env, moto, prefix, tmp_path):
    g = torch.Generator().manual_seed(11)
    state = {"w": torch.randn(20, 10, generator=g), "step": 3, "nested": {"ids": torch.arange(7)}}
    torch.save(state, tmp_path / "model.pt")
    assert run_cli("convert", tmp_path / "model.pt").returncode == 0
    moto.put(BUCKET, f"{prefix}/model.zckpt", (tmp_path / "model.zckpt").read_bytes())
    url = f"s3://{BUCKET}/{prefix}/model.zckpt"
    r = run_cli("export", url, "-o", tmp_path / "back.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert run_cli("export", tmp_path / "model.zckpt", "-o", tmp_path / "local.pt").returncode == 0
    assert (tmp_path / "back.pt").read_bytes() == (tmp_path / "local.pt").read_bytes()
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert torch.equal(back["w"], state["w"]) and back["step"] == 3 and torch.equal(back["nested"]["ids"], state["nested"]["ids"])
    # Export writes local files only: an s3:// destination is refused, not written as a local path.
    r = run_cli("export", url, "-o", f"s3://{BUCKET}/{prefix}/back.pt")
    assert r.returncode == 2 and "local" in r.stderr, r.stderr
    assert not pathlib.Path("s3:").exists()
    # A folder of containers is not one container (as locally); convert reads local sources only.
    r = run_cli("export", f"s3://{BUCKET}/{prefix}", "-o", tmp_path / "x.pt")
    assert r.returncode == 2 and "is a folder" in r.stderr, r.stderr
    r = run_cli("convert", url, "-o", tmp_path / "again.zckpt")
    assert r.returncode == 2 and "download it first" in r.stderr, r.stderr


def test_distcp_shards_in_object_storage_are_refused_naming_them(s3env, moto, prefix, tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.randn(4, 4)}}, checkpoint_id=str(tmp_path / "fs"))
    url = upload(moto, tmp_path / "fs", prefix)
    shard = sorted(p.name for p in (tmp_path / "fs").glob("*.distcp"))[0]
    for args in (("verify", url), ("merge", url, "-o", tmp_path / "hf", "--keys", "model.")):
        r = run_cli(*args)
        assert r.returncode == 2, (args, r.stdout + r.stderr)
        assert url + shard in r.stdout + r.stderr and "convert" in r.stdout + r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "hf").exists()
