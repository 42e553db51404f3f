"""Prints what meson needs to build against the torch of this interpreter, one item a line:
torch dir, C++11 ABI flag (0/1), CUDA version ('' for CPU builds), torch version, the folder of
the libcudart torch itself loads ('' when none), pybind11 include dir ('' when missing),
Python version (major*100+minor), pybind11 ABI defines for torch's extensions ('' when none).

Run by src/loader/meson.build with the project's Python (-Dpython=...), the same way
torch.utils.cpp_extension finds LibTorch for extensions, so any torch 2.x works.
"""
import glob
import os
import sys

import torch

torch_dir = os.path.dirname(torch.__file__)
cuda = torch.version.cuda or ""
cudart_dir = ""
if cuda:
    site = os.path.dirname(torch_dir)
    # cu13 wheels: nvidia/cu13/lib; cu12 wheels: nvidia/cuda_runtime/lib.
    for pattern in ("nvidia/cu*/lib/libcudart.so*", "nvidia/cuda_runtime/lib/libcudart.so*"):
        hits = sorted(glob.glob(os.path.join(site, pattern)))
        if hits:
            cudart_dir = os.path.dirname(hits[0])
            break
try:
    import pybind11  # noqa: F401

    pybind_inc = pybind11.get_include()
except ImportError:
    pybind_inc = ""
print(torch_dir)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(cuda)
print(torch.__version__)
print(cudart_dir)
print(pybind_inc)
print(sys.version_info[0] * 100 + sys.version_info[1])
# torch < 2.10 built its pybind11 with ABI tags an extension must repeat (as cpp_extension does).
tags = []
for attr, macro in (("_PYBIND11_COMPILER_TYPE", "PYBIND11_COMPILER_TYPE"),
                    ("_PYBIND11_STDLIB", "PYBIND11_STDLIB"),
                    ("_PYBIND11_BUILD_ABI", "PYBIND11_BUILD_ABI")):
    val = getattr(torch._C, attr, None)
    if val is not None:
        tags.append(f'-D{macro}="{val}"')
print(" ".join(tags))
