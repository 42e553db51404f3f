"""The benchmarks: `zckpt bench verify` and tools/bench/bench.py run, report what they measured
and refuse a contender whose tensors differ from what torch.save wrote."""
import json
import os
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
