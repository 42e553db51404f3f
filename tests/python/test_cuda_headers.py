"""The CUDA runtime headers fall back to those in torch's NVIDIA wheels when there is no system
CUDA toolkit (tools/build/cuda_include.py, used by src/loader/meson.build): with the system
folders left out, the folders it prints must compile what the CUDA copy engine includes."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from zckpt_testing import REPO

SCRIPT = os.path.join(REPO, "tools", "build", "cuda_include.py")


@pytest.mark.skipif(not torch.version.cuda, reason="torch is a CPU build: its wheels bring no CUDA headers")
@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_wheel_headers_compile_the_engines_includes(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--wheels-only"], capture_output=True, text=True, check=True).stdout
    folders = [line for line in out.splitlines() if line]
    assert folders, "torch is a CUDA build, yet no CUDA runtime headers were found in its wheels"
    assert all("site-packages" in f for f in folders), folders
    src = tmp_path / "probe.cc"
    src.write_text("#include <cuda_runtime_api.h>\n"
                   "static_assert(CUDART_VERSION >= 11000, \"CUDA runtime headers\");\n"
                   "cudaError_t (*f)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t) = cudaMemcpyAsync;\n")
    flags = [x for f in folders for x in ("-isystem", f)]
    r = subprocess.run(["c++", "-std=c++20", "-fsyntax-only", *flags, str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_system_toolkit_comes_first():
    out = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, check=True).stdout.split()
    if os.path.isfile("/usr/local/cuda/include/cuda_runtime_api.h") and not os.environ.get("CUDA_HOME"):
        assert out == ["/usr/local/cuda/include"]
