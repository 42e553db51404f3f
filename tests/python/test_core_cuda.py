"""CUDA loads and saves on the torch-free core: `_core` loads libcudart at run time, never links
it. Here the runtime is tests/cudasim's simulated asynchronous one, reached the way libcudart is
(ZCKPT_CUDART names its file), in a process where torch cannot be imported: simulated device
memory from cudaMalloc is filled by `Checkpoint.load_ranges` and read back with cudaMemcpy, or
filled with cudaMemcpy and written by `save_pickled` through its pinned ring. Without a runtime to
load, the error names what was searched."""
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import zckpt
from zckpt_testing import build_root, flip_byte, ls_json, storage_of, zckpt_bin

SIM = os.path.join(build_root(), "tests", "cudasim", "libzckpt_cudasim.so")
NO_TORCH = "import sys\nsys.modules['torch'] = None\n"

pytestmark = pytest.mark.skipif(not os.path.exists(SIM), reason="no tests/cudasim build (no CUDA runtime headers)")


def _run(code, cwd, cudart=SIM, **env_vars):
    """`code` in a fresh interpreter where torch cannot be imported, after DEVICE_HELPERS, with
    ZCKPT_CUDART=`cudart` and `env_vars`."""
    env = dict(os.environ, ZCKPT_CUDART=cudart, **env_vars)
    r = subprocess.run([sys.executable, "-c", NO_TORCH + DEVICE_HELPERS + textwrap.dedent(code)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


# In the child: the simulator's own functions through ctypes, as torch's would be.
DEVICE_HELPERS = f"""
import ctypes, os
import zckpt._core as core
sim = ctypes.CDLL({SIM!r})
def malloc(n):
    p = ctypes.c_void_p()
    assert sim.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    return p.value
def to_device(data):
    p = malloc(len(data))
    assert sim.cudaMemcpy(ctypes.c_void_p(p), data, ctypes.c_size_t(len(data)), 1) == 0
    return p
def to_host(ptr, n):
    out = ctypes.create_string_buffer(n)
    assert sim.cudaMemcpy(out, ctypes.c_void_p(ptr), ctypes.c_size_t(n), 2) == 0
    return out.raw
def free(ptr):
    assert sim.cudaFree(ctypes.c_void_p(ptr)) == 0
sim.cudasim_copy_bytes.restype = ctypes.c_uint64
sim.cudasim_violation_count.restype = ctypes.c_uint64
sim.cudasim_pageable_copy_bytes.restype = ctypes.c_uint64
sim.cudasim_pinned_allocs.restype = ctypes.c_uint64
"""


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    folder = tmp_path_factory.mktemp("core_cuda")
    g = torch.Generator().manual_seed(3)
    state = {"big": torch.randn(3, 1024, 1024, generator=g),  # 12 MiB: several chunks of 4 MiB
             "small": torch.arange(1000, dtype=torch.int64), "half": torch.randn(77, 33, generator=g).half()}
    torch.save(state, folder / "m.pt")
    zckpt.convert(str(folder / "m.pt"), str(folder / "m.zckpt"), chunk_bytes=4 << 20)
    return folder


def test_storages_and_ranges_fill_simulated_device_memory(container):
    r = _run(f"""
        ckpt = core.open({str(container / 'm.zckpt')!r})
        recs = ckpt.tensor_records()
        path, version = core.cuda_runtime()
        print("runtime", os.path.basename(path), version)
        # Every tensor's bytes: big on the device in two ranges that split a chunk, the rest on the
        # host, in one pass; then the same again all on the device.
        expect = {{}}
        for rec in recs:
            n = rec["byte_end"] - rec["byte_begin"]
            buf = bytearray(n)
            addr = ctypes.addressof((ctypes.c_char * n).from_buffer(buf))
            ckpt.load_ranges([(rec["storage"], rec["byte_begin"], rec["byte_end"], addr, -1)], {{}})
            expect[rec["name"]] = bytes(buf)
        targets, device_ptrs, host_bufs = [], {{}}, {{}}
        for rec in recs:
            n = rec["byte_end"] - rec["byte_begin"]
            if rec["name"] == "big":
                p = malloc(n)
                device_ptrs["big"] = (p, n)
                mid = rec["byte_begin"] + 5 * 1000 * 1000 + 3  # inside the second chunk
                targets.append((rec["storage"], rec["byte_begin"], mid, p, 0))
                targets.append((rec["storage"], mid, rec["byte_end"], p + (mid - rec["byte_begin"]), 0))
            else:
                buf = bytearray(n)
                host_bufs[rec["name"]] = buf
                targets.append((rec["storage"], rec["byte_begin"], rec["byte_end"],
                                ctypes.addressof((ctypes.c_char * n).from_buffer(buf)), -1))
        copied = sim.cudasim_copy_bytes(0)
        stats = ckpt.load_ranges(targets, {{0: 0}})
        p, n = device_ptrs["big"]
        print("device copies", sim.cudasim_copy_bytes(0) - copied == n)
        print("big", to_host(p, n) == expect["big"])
        for name, buf in host_bufs.items():
            print(name, bytes(buf) == expect[name])
        print("verified", stats["verified"], stats["raw_bytes"] >= n)
        free(p)
        all_dev = []
        for rec in recs:
            n = rec["byte_end"] - rec["byte_begin"]
            all_dev.append((rec["name"], malloc(n), n))
        ckpt.load_ranges([(rec["storage"], rec["byte_begin"], rec["byte_end"], p, 0)
                          for rec, (_, p, n) in zip(recs, all_dev)], {{0: 0}}, slots=2, slot_bytes=1 << 20)
        print("all", all(to_host(p, n) == expect[name] for name, p, n in all_dev))
        for _, p, _ in all_dev:
            free(p)
        print("violations", sim.cudasim_violation_count())
    """, container)
    lines = r.stdout.split("\n")
    assert lines[0] == "runtime libzckpt_cudasim.so 12080", r.stdout
    assert "big True" in lines and "small True" in lines and "half True" in lines, r.stdout
    assert "verified True True" in lines and "all True" in lines, r.stdout
    assert "device copies True" in lines and "violations 0" in lines, r.stdout  # DMA, not a host memcpy
    assert "violation" not in r.stderr.lower(), r.stderr[-3000:]


def test_a_corrupt_chunk_on_the_device_path_fails_the_load(container, tmp_path):
    bad = tmp_path / "bad.zckpt"
    bad.write_bytes((container / "m.zckpt").read_bytes())
    # The last byte of the big tensor's first chunk (4 MiB of storage 0, stored raw).
    storage = ls_json(bad)["storages"][0]
    with open(bad, "r+b") as f:
        f.seek(storage["offset"] + (4 << 20) - 1)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    r = _run(f"""
        ckpt = core.open({str(bad)!r})
        rec = [r for r in ckpt.tensor_records() if r["name"] == "big"][0]
        n = rec["byte_end"] - rec["byte_begin"]
        p = malloc(n)
        try:
            ckpt.load_ranges([(rec["storage"], rec["byte_begin"], rec["byte_end"], p, 0)], {{0: 0}})
            print("loaded")
        except Exception as e:
            print(type(e).__name__, e)
        free(p)
    """, tmp_path)
    assert r.stdout.startswith("CorruptError"), r.stdout + r.stderr[-2000:]
    assert str(bad) in r.stdout


def test_a_device_reading_pageable_memory_is_filled_from_the_file_mapping(container, tmp_path):
    """A simulated device that reads pageable memory through the host's page tables (Grace
    Hopper; ZCKPT_SIM_PAGEABLE_ACCESS=1): every tensor copied from pageable memory (the file's
    mapping; nothing pinned), bit for bit the host load's bytes; a flipped byte is refused naming
    its storage."""
    bad = tmp_path / "bad.zckpt"
    bad.write_bytes((container / "m.zckpt").read_bytes())
    storage = ls_json(bad)["storages"][0]
    with open(bad, "r+b") as f:
        f.seek(storage["offset"] + (4 << 20) + 17)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    r = _run(f"""
        ckpt = core.open({str(container / 'm.zckpt')!r})
        recs = ckpt.tensor_records()
        expect = {{}}
        for rec in recs:
            n = rec["byte_end"] - rec["byte_begin"]
            buf = bytearray(n)
            ckpt.load_ranges([(rec["storage"], rec["byte_begin"], rec["byte_end"],
                               ctypes.addressof((ctypes.c_char * n).from_buffer(buf)), -1)], {{}})
            expect[rec["name"]] = bytes(buf)
        dev = [(rec, malloc(rec["byte_end"] - rec["byte_begin"])) for rec in recs]
        ckpt.load_ranges([(rec["storage"], rec["byte_begin"], rec["byte_end"], p, 0) for rec, p in dev], {{0: 0}})
        print("equal", all(to_host(p, rec["byte_end"] - rec["byte_begin"]) == expect[rec["name"]] for rec, p in dev))
        copied, pageable = sim.cudasim_copy_bytes(0), sim.cudasim_pageable_copy_bytes(0)
        print("pageable", copied > 12 << 20 and pageable == copied, "pinned", sim.cudasim_pinned_allocs())
        bad = core.open({str(bad)!r})
        try:
            bad.load_ranges([(rec["storage"], rec["byte_begin"], rec["byte_end"], p, 0) for rec, p in dev], {{0: 0}})
            print("loaded")
        except Exception as e:
            print(type(e).__name__, e)
        for _, p in dev:
            free(p)
        print("violations", sim.cudasim_violation_count())
    """, container, ZCKPT_SIM_PAGEABLE_ACCESS="1")
    lines = r.stdout.split("\n")
    assert "equal True" in lines and "pageable True pinned 0" in lines and "violations 0" in lines, r.stdout
    corrupt = [line for line in lines if line.startswith("CorruptError")]
    assert corrupt and f"storage '{storage['key']}'" in corrupt[0] and str(bad) in corrupt[0], r.stdout + r.stderr[-2000:]


def test_a_device_without_a_stream_is_refused_before_any_byte_moves(container):
    r = _run(f"""
        ckpt = core.open({str(container / 'm.zckpt')!r})
        rec = ckpt.tensor_records()[0]
        try:
            ckpt.load_ranges([(rec["storage"], rec["byte_begin"], rec["byte_end"], 4096, 1)], {{0: 0}})
        except Exception as e:
            print(type(e).__name__, e)
    """, container)
    assert "goes to cuda:1, which has no stream given for the load" in r.stdout, r.stdout + r.stderr


def test_no_cuda_runtime_names_what_was_searched(container):
    missing = str(container / "no-such-libcudart.so.12")
    r = _run(f"""
        ckpt = core.open({str(container / 'm.zckpt')!r})
        rec = ckpt.tensor_records()[0]
        for call in (lambda: core.cuda_runtime(),
                     lambda: ckpt.load_ranges([(rec["storage"], rec["byte_begin"], rec["byte_end"], 4096, 0)], {{0: 0}})):
            try:
                call()
                print("loaded")
            except Exception as e:
                print(type(e).__name__, e)
    """, container, cudart=missing)
    lines = r.stdout.strip().split("\n")
    assert len(lines) == 2, r.stdout + r.stderr
    assert all(f"ZCKPT_CUDART={missing} does not load" in line for line in lines), r.stdout
    assert lines[1].split(" ", 1)[1].startswith("cannot load to cuda:0: no CUDA runtime could be loaded"), r.stdout


def test_save_reads_device_storages_through_the_pinned_ring(tmp_path):
    from zckpt._save import DEFAULT_PROTOCOL, _archive_records, _pickle_like_torch_save

    g = torch.Generator().manual_seed(5)
    obj = {"w": torch.randn(1000, 7000, generator=g),  # 28 MB: several 8 MiB ring slots, the last one partial
           "b": torch.arange(1000), "step": 7}
    obj["w_rows"] = obj["w"][10:20]  # a view: one storage, two tensors
    data, storages = _pickle_like_torch_save(obj, pickle, DEFAULT_PROTOCOL)
    before, after, records = _archive_records(data)
    raw = {key: bytes(torch.empty(0, dtype=torch.uint8).set_(s).numpy()) for key, s in storages.items()}
    (tmp_path / "args.pkl").write_bytes(pickle.dumps((data, raw, before, after, records)))
    out = tmp_path / "from_device.zckpt"
    r = _run(f"""
        import pickle
        data, raw, before, after, records = pickle.loads(open({str(tmp_path / 'args.pkl')!r}, 'rb').read())
        # The large storage in simulated device memory, the small one on the host: one save.
        where, device_ptrs = {{}}, []
        for key, b in raw.items():
            if len(b) > 1 << 20:
                p = to_device(b)
                device_ptrs.append(p)
                where[key] = (p, len(b), 0)
            else:
                buf = ctypes.create_string_buffer(b, len(b))
                where[key] = (ctypes.addressof(buf), len(b), -1)
                device_ptrs.append(buf)
        stats = core.save_pickled({str(out)!r}, data, where, before, after, records, "", {{}}, 0, 0, 0, {{0: 0}})
        print("cuda", stats["cuda_bytes"], stats["cuda_ring_bytes"])
        print("violations", sim.cudasim_violation_count())
    """, tmp_path)
    big = max(len(b) for b in raw.values())
    assert f"cuda {big} {4 * (8 << 20)}" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "violations 0" in r.stdout, r.stdout + r.stderr[-3000:]
    got = zckpt.load(str(out))
    assert got["step"] == 7 and torch.equal(got["w"], obj["w"]) and torch.equal(got["b"], obj["b"])
    assert torch.equal(got["w_rows"], obj["w_rows"])
    assert got["w_rows"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()
    # The container zckpt.save writes of the same object from host memory: same index, same bytes
    # in every storage (the archive's serialization_id record differs: torch makes a new one).
    zckpt.save(obj, str(tmp_path / "from_host.zckpt"))
    assert zckpt.verify(str(out)) == []
    a, b = ls_json(out), ls_json(tmp_path / "from_host.zckpt")
    assert a["tensors"] == b["tensors"] and a["storages"] == b["storages"]
    for s in a["storages"]:
        with open(out, "rb") as fa, open(tmp_path / "from_host.zckpt", "rb") as fb:
            fa.seek(s["offset"])
            fb.seek(s["offset"])
            assert fa.read(s["bytes"]) == fb.read(s["bytes"]), s["key"]

def _cli_load(path, *args, cudart=SIM):
    """`zckpt load PATH --json ARGS` with ZCKPT_CUDART=`cudart`: (rc, parsed JSON, stderr)."""
    env = dict(os.environ, ZCKPT_CUDART=cudart)
    r = subprocess.run([zckpt_bin(), "load", str(path), "--json", *args], capture_output=True, text=True, env=env,
                       timeout=300)
    return r.returncode, __import__("json").loads(r.stdout), r.stderr


@pytest.mark.parametrize("mode", [[], ["--into"]])
def test_command_loads_onto_the_simulated_device(container, mode):
    """`zckpt load --device cuda:0` is the torch-free command (no LibTorch in the binary): its
    destinations are cudaMalloc'd through the runtime it loads at run time and filled through the
    pinned ring, every chunk checked, with no rule of the asynchronous runtime broken."""
    ls = ls_json(container / "m.zckpt")
    raw = sum(s["bytes"] for s in ls["storages"])
    rc, out, err = _cli_load(container / "m.zckpt", "--device", "cuda:0", "--slots", "2", "--slot-bytes", "4MiB", *mode)
    assert rc == 0 and "VIOLATION" not in err, (out, err[-3000:])
    assert out["device"] == "cuda:0" and out["verified"] and out["mode"] == ("into" if mode else "load")
    assert out["chunks"] == sum(s["chunks"] for s in ls["storages"])
    # The destination is all the device memory the load allocates (the ring is pinned host
    # memory), and the simulator's cudaMemGetInfo agrees within its allocation rounding.
    if mode:
        assert out["bytes"] == sum(t["bytes"] for t in ls["tensors"]), out
        assert out["device_peak_bytes"] == 0
    else:
        assert out["bytes"] == raw and out["device_peak_bytes"] == raw, out
        assert raw <= out["device_used_delta"] <= raw + len(ls["storages"]) * (2 << 20), out


def test_command_cuda_errors_name_what_is_missing(container, tmp_path):
    """A damaged chunk fails the device load with exit 1 naming the storage; no runtime to load
    and a device the runtime lacks exit 2, naming the library searched and the device count."""
    bad = tmp_path / "bad.zckpt"
    bad.write_bytes((container / "m.zckpt").read_bytes())
    big = storage_of(bad, "big")
    flip_byte(bad, big["offset"] + big["bytes"] - 5)
    rc, out, err = _cli_load(bad, "--device", "cuda:0")
    assert rc == 1 and out["status"] == "corrupt" and big["key"] in out["error"], out
    assert "VIOLATION" not in err, err[-3000:]
    rc, out, _ = _cli_load(container / "m.zckpt", "--device", "cuda:0", cudart=str(tmp_path / "libcudart.so.99"))
    assert rc == 2 and f"ZCKPT_CUDART={tmp_path / 'libcudart.so.99'} does not load" in out["error"], out
    rc, out, _ = _cli_load(container / "m.zckpt", "--device", "cuda:3")
    assert rc == 2 and "no CUDA device 3" in out["error"] and "libzckpt_cudasim.so sees 1" in out["error"], out
