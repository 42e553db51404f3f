"""The object reader and writer against the shaping S3 server (issue 34): with S3's latency the
requests in flight grow past the old cap of 8, ZCKPT_S3_CONNECTIONS caps them, a chunk brought
by several GETs with a flipped byte is fetched again alone and checked, an open is at most two GETs
and no HEAD, an upload keeps several parts in flight on few connections, and host memory stays
bounded by what is in flight. Small objects; each assertion fails without the behaviour."""
import json
import os
import subprocess
import sys

import pytest
import torch

import s3_server
import zckpt
import zckpt_testing
from s3_server import shaping_server as ss

from test_object_storage import byte_range, flip_object_byte
from test_shaping_server import BUCKET, server, shaped  # noqa: F401 (the shaping server's fixtures)

MiB = 1 << 20
CHUNK = 4 * MiB


def model(mib):
    g = torch.Generator().manual_seed(mib)
    return {"w": torch.randn(mib * MiB // 4, generator=g), "b": torch.randn(1000, generator=g)}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def served(server, tmp_path, name, mib):
    """`model(mib)` saved with 4 MiB chunks, served as s3://BUCKET/name; (url, local path, model)."""
    local = str(tmp_path / name)
    m = model(mib)
    zckpt.save(m, local, chunk_bytes=CHUNK)
    server.serve_file(BUCKET, name, local)
    return f"s3://{BUCKET}/{name}", local, m


def test_requests_in_flight_exceed_the_old_cap_when_latency_is_high(shaped, tmp_path):
    url, _, m = served(shaped, tmp_path, "wide.zckpt", 48)
    shaped.set_shaping(ss.S3_LIKE)
    shaped.reset_stats()
    assert_same(zckpt.load(url), m)
    st = shaped.stats()
    assert st["peak_in_flight"] > 8, st  # 8 was the old default and what it reached


def test_connections_cap_the_requests_in_flight(shaped, tmp_path, monkeypatch):
    url, _, m = served(shaped, tmp_path, "capped.zckpt", 48)
    monkeypatch.setenv("ZCKPT_S3_CONNECTIONS", "3")
    shaped.set_shaping(ss.Shaping.of(ttfb_ms=30))
    shaped.reset_stats()
    assert_same(zckpt.load(url), m)
    st = shaped.stats()
    assert 2 <= st["peak_in_flight"] <= 3, st


def test_open_is_one_get_and_no_head(shaped, tmp_path):
    # A container smaller than what an open fetches first: loading it, pickle included, is that
    # one GET; a larger one adds one GET for its end (footer, index, pickle), then its chunks.
    local = str(tmp_path / "tiny.zckpt")
    m = {"x": torch.arange(1000, dtype=torch.float32), "y": torch.ones(7, 9)}
    zckpt.save(m, local)
    shaped.serve_file(BUCKET, "tiny.zckpt", local)
    shaped.reset_stats()
    assert_same(zckpt.load(f"s3://{BUCKET}/tiny.zckpt"), m)
    ops = shaped.stats()["requests"]
    assert ops.get("HeadObject", 0) == 0 and ops.get("GetObject", 0) == 1, ops


def big_storage_offset(local):
    """Where the first storage of a MiB or more begins in the container (zckpt ls --json)."""
    ls = subprocess.run([zckpt_testing.zckpt_bin(), "ls", "--json", local], capture_output=True, text=True, check=True)
    return next(s["offset"] for s in json.loads(ls.stdout)["storages"] if s["bytes"] >= MiB)


def test_a_chunk_over_several_gets_with_a_flipped_byte_is_fetched_again_alone(shaped, tmp_path, monkeypatch):
    # 1 MiB GETs: each 4 MiB chunk comes in four of them. One byte of the second chunk comes
    # flipped in the first GET that holds it: that chunk alone is fetched again (its four GETs)
    # and checked; the load equals the saved tensors.
    url, local, m = served(shaped, tmp_path, "flip.zckpt", 16)
    chunk = big_storage_offset(local) + CHUNK  # w's second chunk
    at = chunk + CHUNK // 2 + 12345
    proxy = s3_server.FaultProxy(shaped.port)
    try:
        s3_server.point_zckpt_at(monkeypatch, proxy.url, ZCKPT_S3_TIMEOUT="20", ZCKPT_S3_GET_MB="1")
        flipped = []

        def once(method, path, headers, n):
            if n >= 1:
                lo, hi = byte_range(headers["Range"])
                if lo <= at < hi and not flipped:
                    flipped.append((lo, hi))
                    return ("flip", at - lo)
            return None

        proxy.reset(once)
        assert_same(zckpt.load(url), m)
        gets = [byte_range(r) for method, _, r in proxy.log if method == "GET" and r]
        assert len(flipped) == 1 and flipped[0][1] - flipped[0][0] <= MiB, flipped
        after = gets[[i for i, g in enumerate(gets) if g == flipped[0]][0] + 1:]
        refetch = [g for g in after if chunk <= g[0] < chunk + CHUNK]
        # The chunk again, whole, in 1 MiB GETs: and nothing of its neighbours with it.
        assert sorted(refetch)[0][0] == chunk and max(hi for _, hi in refetch) == chunk + CHUNK, refetch
        assert sum(hi - lo for lo, hi in refetch) >= CHUNK and all(hi - lo <= MiB for lo, hi in refetch), refetch

        proxy.reset(flip_object_byte(at))
        with pytest.raises(zckpt.CorruptError) as e:
            zckpt.load(url)
        msg = str(e.value)
        assert url in msg and f"file bytes [{chunk}, " in msg and "4 fetches" in msg, msg
    finally:
        proxy.close()


def test_host_memory_is_bounded_by_what_is_in_flight(shaped, tmp_path):
    # `zckpt load` of a 96 MiB object: the process grows by the tensors it loads and the ring,
    # not by another copy of the object (GETs land where the bytes belong).
    url, _, _ = served(shaped, tmp_path, "rss.zckpt", 96)
    shaped.set_shaping(ss.Shaping.of(ttfb_ms=10))
    env = dict(os.environ)
    ld = subprocess.run([zckpt_testing.zckpt_bin(), "load", url, "--json"], capture_output=True, text=True, env=env,
                        timeout=120)
    assert ld.returncode == 0, ld.stdout + ld.stderr
    r = json.loads(ld.stdout)
    assert r["rss_peak_delta"] <= 96 * MiB + r["ring_bytes"] + 48 * MiB, r


def test_an_upload_keeps_parts_in_flight_on_few_connections(shaped, monkeypatch):
    # 48 MiB in 5 MiB parts with S3's latency: several parts at once, each connection reused.
    monkeypatch.setenv("ZCKPT_S3_PART_MB", "5")
    m = model(48)
    shaped.set_shaping(ss.Shaping.of(ttfb_ms=30, conn_mibs=50))
    shaped.reset_stats()
    zckpt.save(m, f"s3://{BUCKET}/saved.zckpt")
    st = shaped.stats()
    assert st["requests"].get("UploadPart", 0) >= 9 and st["peak_in_flight"] >= 6, st
    assert st["connections"] <= st["peak_in_flight"] + 4, st
    shaped.set_shaping(ss.NONE)
    assert_same(zckpt.load(f"s3://{BUCKET}/saved.zckpt"), m)


def test_verify_of_an_object_folder_asks_no_head_and_reads_each_magic_once(shaped, tmp_path):
    # Each object's magic is one 8-byte GET; each container is then opened once (its first GET
    # holds all of a small one) and checked.
    for i in range(3):
        local = str(tmp_path / f"m{i}.zckpt")
        zckpt.save({"x": torch.full((100,), float(i))}, local)
        shaped.serve_file(BUCKET, f"vf/m{i}.zckpt", local)
    shaped.put(BUCKET, "vf/notes.txt", b"not a container, longer than a magic")
    shaped.reset_stats()
    v = zckpt_testing.run_cli("verify", f"s3://{BUCKET}/vf/")
    assert v.returncode == 0, v.stdout + v.stderr
    assert v.stdout.count(".zckpt") >= 3, v.stdout
    ops = shaped.stats()["requests"]
    assert ops.get("HeadObject", 0) == 0, ops
    assert ops.get("GetObject", 0) <= 4 + 3 * 3, ops  # 4 magics, then an open and a read each


def test_iter_tensors_of_an_object_fetches_the_next_tensors_ahead(shaped, tmp_path):
    # Sixteen 2 MiB tensors at S3's latency: streamed one by one, but the next ones' bytes are
    # asked for ahead (several GETs in flight), and every tensor equals the saved one.
    local = str(tmp_path / "stream.zckpt")
    g = torch.Generator().manual_seed(7)
    m = {f"t{i:02d}": torch.randn(MiB // 2, generator=g) for i in range(16)}
    zckpt.save(m, local, chunk_bytes=CHUNK)
    shaped.serve_file(BUCKET, "stream.zckpt", local)
    shaped.set_shaping(ss.S3_LIKE)
    shaped.reset_stats()
    got = dict(zckpt.iter_tensors(f"s3://{BUCKET}/stream.zckpt"))
    st = shaped.stats()
    assert_same(got, m)
    assert st["peak_in_flight"] >= 4, st  # one tensor at a time was one GET in flight


ITERATE_DROPPING = r"""
import gc, json, sys, zckpt
def mem():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) << 10 for k, _, v in (l.partition(":") for l in f) if k in ("VmRSS", "VmHWM")}
out = []
for _ in range(3):
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = mem()["VmRSS"]
    n = sum(t.numel() for _, t in zckpt.iter_tensors(sys.argv[1]))
    gc.collect()
    after = mem()
    out.append({"n": n, "peak": after["VmHWM"] - before, "kept": after["VmRSS"] - before})
print(json.dumps(out))
"""


def test_iter_tensors_of_an_object_holds_the_read_ahead_not_the_object(shaped, tmp_path):
    # 128 MiB of 4 MiB tensors, each dropped as it comes: a pass holds the read-ahead (96 MiB at
    # most) and the tensor at hand, and gives it all back; three passes in one process keep
    # nothing (a read-ahead part that kept itself alive held every byte fetched ahead).
    local = str(tmp_path / "drop.zckpt")
    g = torch.Generator().manual_seed(3)
    m = {f"t{i:02d}": torch.randn(MiB, generator=g) for i in range(32)}
    zckpt.save(m, local, chunk_bytes=CHUNK)
    shaped.serve_file(BUCKET, "drop.zckpt", local)
    shaped.set_shaping(ss.NONE)
    r = subprocess.run([sys.executable, "-c", ITERATE_DROPPING, f"s3://{BUCKET}/drop.zckpt"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    passes = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(p["n"] == 32 * MiB for p in passes), passes
    for p in passes[1:]:  # the first pass also pays the imports' first allocations
        assert p["peak"] <= (96 + 3 * 4 + 16) * MiB, passes
        assert p["kept"] <= 16 * MiB, passes
