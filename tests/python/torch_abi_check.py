"""Whether zckpt._C can run under a torch: a test helper, outside the package, since _C is too.

zckpt._C is built for the test suite only (the same calls on LibTorch's C++ API, which the tests
hold the package's torch-free paths against); no call of the package uses it, and it is never
installed. It and libzckpt link LibTorch's C++ libraries, whose ABI holds only within one torch
release line: under another one they fail to load with an undefined symbol, or load and
misread torch's objects. The rule (as for any torch C++ extension): the same torch
major.minor, the same flavour (CPU, or CUDA of the same major version: the libcudart soname
the build linked), and the same C++11 ABI flag as the torch zckpt was built against
(zckpt/_torch_build.py, written at build time beside _C). Patch releases of torch are compatible.
"""
import re

REBUILD_HINT = ("rebuild zckpt in this environment: pip install --no-build-isolation --force-reinstall "
                "--no-deps <zckpt source folder or URL>")


def _major_minor(version):
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def flavour(cuda):
    """'CPU', or 'CUDA N' for a CUDA build of torch (torch.version.cuda 'N.M')."""
    return f"CUDA {cuda.split('.')[0]}" if cuda else "CPU"


def incompatibility(built, running):
    """Why a zckpt built for torch `built` cannot run under torch `running`; None when it can.

    Each is (version, cuda, cxx11_abi): torch.__version__, torch.version.cuda or '', and
    torch._C._GLIBCXX_USE_CXX11_ABI (None when unknown).
    """
    (b_version, b_cuda, b_abi), (r_version, r_cuda, r_abi) = built, running
    why = []
    if _major_minor(b_version) is None or _major_minor(b_version) != _major_minor(r_version):
        why.append(f"torch {r_version} is not a {'.'.join(map(str, _major_minor(b_version) or ()))} release")
    if flavour(b_cuda) != flavour(r_cuda):
        why.append(f"it is a {flavour(r_cuda)} build of torch, zckpt was built for {flavour(b_cuda)}")
    if b_abi is not None and r_abi is not None and int(b_abi) != int(r_abi):
        why.append(f"its _GLIBCXX_USE_CXX11_ABI is {int(r_abi)}, zckpt was built with {int(b_abi)}")
    return "; ".join(why) or None


def check_torch():
    """Raises ImportError naming both torches when the imported torch is not one zckpt runs under."""
    import torch

    from zckpt import _build_info, _torch_build as b

    running = (torch.__version__, torch.version.cuda or "", getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None))
    why = incompatibility((b.TORCH_VERSION, b.TORCH_CUDA, b.TORCH_CXX11_ABI), running)
    if why:
        raise ImportError(
            f"zckpt {_build_info.VERSION}'s _C was built for torch {b.TORCH_VERSION} ({flavour(b.TORCH_CUDA)}) and cannot run "
            f"under torch {torch.__version__} ({flavour(running[1])}) from {torch.__file__}: {why}. "
            f"zckpt loads only under the torch major.minor and CPU/CUDA flavour it was compiled against; "
            f"{REBUILD_HINT}")
