"""Signed requests as S3 checks them (issue 25): moto[server] in its IAM mode verifies every
request's SigV4 signature and access key (botocore's signer on the server side), so every kind
of request zckpt makes is held to a signature check here: HEAD, ranged GET with If-Match, PUT,
the multipart calls (POST ?uploads, PUT ?partNumber&uploadId, POST ?uploadId), ListObjectsV2
with a prefix and continuation tokens, on keys with characters that need encoding.

Found by this file: libcurl signed the empty "Expect:" header zckpt gave it to turn off
100-continue and then sent no such header, so every signed request was SignatureDoesNotMatch
against a server that checks (the unsigned moto of test_object_storage.py accepted them)."""
import json
import os
import subprocess

import pytest
import torch

import s3_server
import zckpt
import zckpt_testing
from zckpt import _C

BUCKET = "signed"
FOLDER = f"s3://{BUCKET}/run 1/step=100&final+x"  # a space, '=', '&' and '+' to encode


@pytest.fixture(scope="module")
def server():
    yield from s3_server.serve_moto(BUCKET, check_signatures=True)


@pytest.fixture
def signed_env(server, monkeypatch):
    return s3_server.point_zckpt_at(monkeypatch, server.url, AWS_ACCESS_KEY_ID=server.access_key,
                                    AWS_SECRET_ACCESS_KEY=server.secret_key, ZCKPT_S3_ATTEMPTS="2")


def tensors(seed, mib):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(mib << 18, generator=g), "b": torch.randn(1000, generator=g).to(torch.bfloat16),
            "step": seed}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_the_server_refuses_a_wrong_signature(signed_env, monkeypatch):
    # The check this file relies on: a request signed with another secret is refused.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(zckpt.ZckptError) as e:
        _C.write_object(f"{FOLDER}/refused", b"x")
    msg = str(e.value)
    assert "403" in msg and "SignatureDoesNotMatch" in msg and "AWS_SECRET_ACCESS_KEY" in msg, msg
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", signed_env["AWS_SECRET_ACCESS_KEY"])
    assert not _C.object_exists(f"{FOLDER}/refused")


def test_multipart_save_ranged_load_listing_pages_all_signed(signed_env, monkeypatch, tmp_path):
    monkeypatch.setenv("ZCKPT_S3_PART_MB", "5")
    a, b = tensors(1, 12), tensors(2, 1)  # 12 MiB: three parts; 1 MiB: one PUT
    zckpt.save(a, f"{FOLDER}/a.zckpt", chunk_bytes=1 << 20)
    zckpt.save(b, f"{FOLDER}/b.zckpt")
    _C.write_object(f"{FOLDER}/notes/readme.txt", b"side file")
    same(zckpt.load(f"{FOLDER}/a.zckpt"), a)   # HEAD + ranged GETs with If-Match
    same(zckpt.load(f"{FOLDER}/b.zckpt"), b)
    monkeypatch.setenv("ZCKPT_S3_LIST_KEYS", "1")  # a page per object: continuation tokens signed
    names = [n for n, _ in _C.list_objects(FOLDER)]
    assert names == ["a.zckpt", "b.zckpt", "notes/readme.txt"], names
    assert _C.read_object(f"{FOLDER}/notes/readme.txt") == b"side file"
    got = dict(zckpt.iter_tensors(FOLDER + "/"))
    assert set(got) == {"w", "b"} and torch.equal(got["w"], b["w"]), "b.zckpt comes last, its w wins"
    local = tmp_path / "a.zckpt"
    zckpt.save(a, str(local), chunk_bytes=1 << 20)
    assert zckpt.load(str(local))["w"].equal(zckpt.load(f"{FOLDER}/a.zckpt")["w"])


def test_cli_on_a_signature_checking_server(signed_env):
    zckpt.save(tensors(3, 2), f"{FOLDER}/cli.zckpt")
    env = dict(os.environ, **signed_env)
    out = {}
    for cmd in ("ls", "verify", "load"):
        r = subprocess.run([zckpt_testing.zckpt_bin(), cmd, f"{FOLDER}/cli.zckpt"], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        out[cmd] = r.stdout
    assert "w" in out["ls"] and "step" not in out["ls"].split()[:1], out["ls"]


def test_temporary_credentials_need_their_session_token(signed_env, server, monkeypatch):
    key, secret, token = server.temporary_credentials(server.python)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    obj = tensors(4, 1)
    zckpt.save(obj, f"{FOLDER}/sts.zckpt")
    same(zckpt.load(f"{FOLDER}/sts.zckpt"), obj)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "not-the-token")
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.load(f"{FOLDER}/sts.zckpt")
    assert "InvalidToken" in str(e.value) and "AWS_SESSION_TOKEN" in str(e.value), str(e.value)
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.load(f"{FOLDER}/sts.zckpt")
    assert "403" in str(e.value), str(e.value)


def uploads_of(server, key):
    return json.loads(server.boto(server.python, (
        f"r = s3.list_multipart_uploads(Bucket={BUCKET!r}, Prefix={key!r})\n"
        f"print(json.dumps([u['UploadId'] for u in r.get('Uploads', []) if u['Key'] == {key!r}]))")))


def leave_unfinished_upload(server, key):
    """What a writer killed half-way leaves: an upload begun, a part sent, never completed."""
    server.boto(server.python, (
        f"u = s3.create_multipart_upload(Bucket={BUCKET!r}, Key={key!r})['UploadId']\n"
        f"s3.upload_part(Bucket={BUCKET!r}, Key={key!r}, UploadId=u, PartNumber=1, Body=b'x' * (5 << 20))"))


def test_unfinished_uploads_of_a_killed_writer_are_aborted_by_the_next_writer(signed_env, server, monkeypatch):
    key, other = "run 1/stale+1.zckpt", "run 1/other.zckpt"
    leave_unfinished_upload(server, key)
    leave_unfinished_upload(server, other)
    assert len(uploads_of(server, key)) == 1
    # moto gives every upload the same Initiated time (2010-11-10): the age limit is shown by
    # setting it above and below that age, not by waiting.
    monkeypatch.setenv("ZCKPT_S3_STALE_UPLOAD_S", str(100 * 365 * 86400))
    zckpt.save(tensors(5, 1), f"s3://{BUCKET}/{key}")  # younger than the limit: left alone
    assert len(uploads_of(server, key)) == 1
    monkeypatch.setenv("ZCKPT_S3_STALE_UPLOAD_S", "0")
    monkeypatch.setenv("ZCKPT_S3_PART_MB", "5")
    big = tensors(6, 12)
    zckpt.save(big, f"s3://{BUCKET}/{key}")  # multipart itself: its own upload is completed, not listed
    assert uploads_of(server, key) == []
    assert len(uploads_of(server, other)) == 1, "another key's upload is not this writer's to sweep"
    same(zckpt.load(f"s3://{BUCKET}/{key}"), big)


def test_virtual_host_addressing_on_a_signature_checking_server(signed_env, server, monkeypatch):
    # BUCKET.localhost:PORT: libcurl resolves any NAME.localhost to loopback itself, and moto takes
    # the bucket from the Host header, which is signed (tests/remote checks the URLs' shape).
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://localhost:{server.port}")
    monkeypatch.setenv("ZCKPT_S3_ADDRESSING", "virtual")
    monkeypatch.setenv("ZCKPT_S3_PART_MB", "5")
    obj = tensors(7, 12)  # multipart
    zckpt.save(obj, f"s3://{BUCKET}/virtual/v.zckpt", chunk_bytes=1 << 20)
    same(zckpt.load(f"s3://{BUCKET}/virtual/v.zckpt"), obj)
    assert [n for n, _ in _C.list_objects(f"s3://{BUCKET}/virtual/")] == ["v.zckpt"]
    keys = json.loads(server.boto(server.python, (
        f"print(json.dumps([o['Key'] for o in s3.list_objects_v2(Bucket={BUCKET!r}, Prefix='virtual/')['Contents']]))")))
    assert keys == ["virtual/v.zckpt"], keys
