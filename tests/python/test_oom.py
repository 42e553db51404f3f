"""Running out of memory reaches Python as zckpt.OutOfMemoryError, which is a
torch.OutOfMemoryError (so resume code catches it the way it catches torch's) and a
zckpt.ZckptError; and where storages go on a mixed-device load.

Without a GPU the out-of-memory case is provoked on the host: a child process whose address
space is capped (RLIMIT_AS) just above what it already uses plus the file's mapping loads a
file holding a 256 MiB storage. The same class is raised for the CUDA caching allocator's error (C++:
tests/loader/failure_test.cc; on a GPU: tools/bench/oom_repro.py)."""
import os
import subprocess
import sys

import pytest
import torch

import zckpt

CHILD = r"""
import os, resource, sys, torch, zckpt
path = sys.argv[1]
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize:")).split()[1]) * 1024
# Room for the file's mapping and small allocations, not for the 256 MiB storage besides.
limit = vm + os.path.getsize(path) + (96 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    zckpt.load(path)
except torch.OutOfMemoryError as e:
    print("OOM", type(e).__name__, isinstance(e, zckpt.ZckptError), str(e).splitlines()[0])
    sys.exit(0)
except BaseException as e:
    print("OTHER", type(e).__name__, e)
    sys.exit(1)
print("LOADED")
sys.exit(1)
"""


def test_out_of_memory_error_is_torchs():
    assert issubclass(zckpt.OutOfMemoryError, torch.OutOfMemoryError)
    assert issubclass(zckpt.OutOfMemoryError, zckpt.ZckptError)
    assert not issubclass(zckpt.CorruptError, torch.OutOfMemoryError)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_load_out_of_memory_raises_torch_out_of_memory_error(tmp_path):
    pt = str(tmp_path / "big.pt")
    torch.save({"w": torch.ones(64 << 20, dtype=torch.float32), "b": torch.zeros(3)}, pt)
    dst = str(tmp_path / "big.zckpt")
    zckpt.convert(pt, dst)
    os.remove(pt)
    r = subprocess.run([sys.executable, "-c", CHILD, dst], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    kind, name, is_zckpt, message = r.stdout.split(" ", 3)
    assert (kind, name, is_zckpt) == ("OOM", "OutOfMemoryError", "True"), r.stdout
    assert str(256 << 20) in message, message


def test_dict_map_location_keeps_cpu_storages_on_cpu(tmp_path):
    """A dict map_location that sends some locations elsewhere: one pass, every storage where
    the dict says (here all CPU, the CUDA half of it runs in tests/loader/cuda_test.cc)."""
    pt = str(tmp_path / "m.pt")
    torch.save({"a": torch.arange(10), "b": torch.ones(3, 3)}, pt)
    dst = str(tmp_path / "m.zckpt")
    zckpt.convert(pt, dst)
    got = zckpt.load(dst, map_location={"cpu": "cpu", "cuda:0": "cpu"})
    assert {t.device.type for t in got.values()} == {"cpu"}
    assert torch.equal(got["a"], torch.arange(10))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_devices_each_storage_on_its_own_device(tmp_path):
    """CPU storages in a mostly-CUDA file stay on the CPU, and the device receives the CUDA
    storages only: none is parked on the device and moved off it afterwards."""
    pt = str(tmp_path / "mixed.pt")
    state = {f"w{i}": torch.randn(256, 1024, device="cuda") for i in range(3)}
    state["cpu_buffer"] = torch.randn(4 << 20)  # 16 MiB on the host
    torch.save(state, pt)
    dst = str(tmp_path / "mixed.zckpt")
    zckpt.convert(pt, dst)
    cuda_bytes = sum(t.numel() * t.element_size() for k, t in state.items() if t.is_cuda)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    got = zckpt.load(dst)
    peak = torch.cuda.max_memory_allocated() - before
    assert got["cpu_buffer"].device.type == "cpu" and got["w0"].is_cuda
    assert peak <= cuda_bytes + 3 * 512, (peak, cuda_bytes)
    for k, t in state.items():
        assert torch.equal(got[k].cpu(), t.cpu()), k
