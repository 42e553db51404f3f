"""The benchmarks: `zckpt bench verify`, tools/bench/bench.py and tools/bench/bench_s3.py run,
report what they measured and refuse a contender whose tensors differ from what was saved."""
import json
import os
import re
import subprocess
import sys

import pytest

from zckpt_testing import zckpt_bin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tools", "bench")
sys.path.insert(0, BENCH)
import bench  # noqa: E402
import contenders  # noqa: E402


def _cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def _page_cache_evictable(path):
    """False on tmpfs and the like, where a file's pages are its storage and cannot be dropped."""
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()
    return fs not in ("tmpfs", "ramfs")


def test_bench_verify_reports_rounds_and_the_xxh3_kernel(family):
    out = subprocess.run([zckpt_bin(), "bench", "verify", family.zckpt("module_state_dict.pt"), "--rounds", "2", "--json"],
                         capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    assert d["rounds"] == 2
    for key in ("read", "xxh3_cache", "xxh3_map", "verify"):
        assert 0 < d[f"{key}_seconds_min"] <= d[f"{key}_seconds_median"] <= d[f"{key}_seconds_max"]
    assert d["loadavg_max"] >= d["loadavg_min"] >= 0
    flags = _cpu_flags()
    if "avx512f" in flags:
        assert d["xxh3_kernel"] in ("avx512", "portable")
    elif "avx2" in flags:
        assert d["xxh3_kernel"] in ("avx2", "portable")
    # Debian's libxxhash has the dispatcher: this build must use it where the CPU allows.
    if "avx2" in flags and os.path.exists("/usr/include/xxh_x86dispatch.h"):
        assert d["xxh3_kernel"] != "portable"


def test_bench_runs_interleaved_rounds_warm_and_cold(tmp_path):
    """A small shard, one round: every contender's tensors equal torch.save's, the page cache as
    asked (warm: all resident, cold: evicted), machine load recorded."""
    if not _page_cache_evictable(tmp_path):
        pytest.skip("cold runs need a filesystem whose pages can be evicted")
    out_json = tmp_path / "bench.json"
    env = dict(os.environ)
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench.py"), "--zckpt", zckpt_bin(), "--gib", "0.02",
                        "--rounds", "1", "--only", "zckpt_py,torch,zckpt_mmap,floor_pread_tricks",
                        "--peers-python", str(tmp_path / "none"), "--workdir", str(tmp_path / "work"),
                        "--out", str(out_json)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(out_json.read_text())
    rows = {(x["contender"], x["mode"]): x for x in d["rows"]}
    for name in ("zckpt_py", "torch", "zckpt_mmap", "floor_pread_tricks"):
        for mode in ("warm", "cold"):
            row = rows[(name, mode)]
            assert row["n"] == 1 and row["median"] > 0 and row["cache_ok"], row
            if not name.startswith("floor"):
                assert row["identical"] is True, row
    assert len(d["runs"]) == 8
    assert all("load_before" in x and "machine_busy" in x for x in d["runs"])
    assert "x ref (paired)" in r.stdout and "loadavg" in r.stdout


def test_bench_in_place_contenders_and_their_targets(tmp_path):
    """The in-place rows (zckpt.load_into and safetensors' safe_open + copy_ into tensors made
    before the clock, verified and not) and the faulted-memory floors run, every loader's tensors
    equal torch.save's, and the three targets of a verified copy are judged from them."""
    out_json = tmp_path / "bench.json"
    only = ("zckpt_into_py,zckpt_into_py_noverify,safetensors_into,zckpt_mmap,zckpt_mmap_noverify,"
            "floor_pread_faulted,floor_memcpy_faulted")
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench.py"), "--zckpt", zckpt_bin(), "--gib", "0.02",
                        "--rounds", "1", "--modes", "warm", "--only", only,
                        "--peers-python", str(tmp_path / "none"), "--workdir", str(tmp_path / "work"),
                        "--out", str(out_json)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(out_json.read_text())
    rows = {x["contender"]: x for x in d["rows"]}
    for name in only.split(","):
        assert rows[name]["n"] == 1 and rows[name]["median"] > 0, rows[name]
        assert rows[name]["identical"] is (None if name.startswith("floor") else True), rows[name]
    judged = {t["target"] for t in d["targets"]}
    assert {"verified in-place load <= 1.15x the faulted-memory copy floor (warm)",
            "verified in-place load <= safetensors safe_open + copy_ (warm)",
            "verified mmap load + read all <= 1.2x the same with verify=False (warm)"} <= judged, judged


def test_summary_flags_different_tensors_and_a_cache_not_as_asked():
    expected = {"digest": "good", "tensor_bytes": 1, "tensors": 1}
    runs = [
        {"contender": "zckpt_py", "mode": "warm", "round": 0, "seconds": 1.0, "cpu_seconds": 1.0, "digest": "good",
         "resident_before": 1.0},
        {"contender": "torch", "mode": "warm", "round": 0, "seconds": 2.0, "cpu_seconds": 1.0, "digest": "bad",
         "resident_before": 1.0},
        {"contender": "safetensors", "mode": "cold", "round": 0, "seconds": 2.0, "cpu_seconds": 1.0,
         "digest": "good", "resident_before": 0.5},
    ]
    rows = {(x["contender"], x["mode"]): x for x in
            bench.summarize(runs, expected, ["zckpt_py", "torch", "safetensors"], ["warm", "cold"], "zckpt_py")}
    assert rows[("zckpt_py", "warm")]["identical"] is True
    assert rows[("torch", "warm")]["identical"] is False
    assert rows[("torch", "warm")]["ratio_median"] == 2.0
    assert rows[("safetensors", "cold")]["cache_ok"] is False


def test_eviction_leaves_no_page_cached(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(os.urandom(4 << 20))
    assert contenders.prepare_cache(str(p), "warm") == 1.0
    with open(p, "rb") as f:
        os.fsync(f.fileno())
    if _page_cache_evictable(tmp_path):
        assert contenders.prepare_cache(str(p), "fadvise") <= 0.01


def test_bench_s3_times_every_contender_or_says_why_not(tmp_path):
    """tools/bench/bench_s3.py, small, on the shaping server shaped and unshaped: the zckpt rows and
    the local reference timed, with the requests each kept in flight; the floor row under shaping;
    boto3's and Run:ai's rows timed or 'skipped: WHY' (no boto3, no peers virtualenv); none with
    results that differ (that exits 1)."""
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_s3.py"), "--mib", "8", "--rounds", "2", "-j", "4",
                        "--server", "shaped,unshaped", "--ttfb-ms", "5", "--link-mibs", "200"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    shaped, unshaped = r.stdout.split("\n[shaped]", 1)[1].split("\n[unshaped]", 1)
    num = r"[0-9.]+"
    for table in (shaped, unshaped):
        for name in ("zckpt.load", "zckpt.save"):
            assert re.search(rf"^{re.escape(name)} +{num} +{num} +{num} +\d+ +(\d+%|-) +[1-9]\d* +\d+ +-?\d+$",
                             table, re.M), table
        assert re.search(rf"^local \(warm\) +{num} .* - +- +- +-?\d+$", table, re.M), table
        for name in ("runai streamer", "boto3 download+load", "boto3 upload_file"):
            assert re.search(rf"^{re.escape(name)}(: skipped: .+| +{num} )", table, re.M), table
    assert re.search(r"^floor \(size/link\+TTFB\) +[0-9.]+ .* 100% ", shaped, re.M), shaped
    assert not re.search(r"^floor ", unshaped, re.M), unshaped  # no link: no floor
    assert "WRONG" not in r.stdout


def test_bench_s3_comparisons_name_the_tensors_that_differ():
    import torch

    import bench_s3

    want = {"a": torch.arange(6, dtype=torch.int16), "b": torch.ones(2, 3, dtype=torch.bfloat16)}
    digests = contenders.tensor_digests(want)
    flipped = {k: v.clone() for k, v in want.items()}
    flipped["b"].view(torch.int16)[0, 1] ^= 1
    renamed = {"a": want["a"], "c": want["b"]}
    widened = {"a": want["a"].to(torch.int32), "b": want["b"]}
    reshaped = {"a": want["a"].reshape(2, 3), "b": want["b"]}
    for got, bad in ((flipped, ["b"]), (renamed, ["b", "c"]), (widened, ["a"]), (reshaped, ["a"]), (dict(want), [])):
        assert sorted(bench_s3.differing(got, want)) == bad
        assert bench_s3.differing_digests(contenders.tensor_digests(got), digests) == bad
