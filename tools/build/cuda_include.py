"""Prints the include folders that hold the CUDA runtime's headers (cuda_runtime_api.h and the
crt/host_defines.h it includes), one a line, or nothing when there are none. Run by meson with
the project's Python; imports nothing but the standard library (torch-free builds use it too).

In order: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda (a system toolkit), then the NVIDIA wheels in
this Python's site-packages that torch's CUDA wheels install (nvidia/cu13/include,
nvidia/cuda_runtime/include, ...). Those ship the runtime headers without crt/, which comes with
the compiler's wheel (nvidia/cuda_nvcc, nvidia/cuda_crt) or triton's copy of the headers
(triton/backends/nvidia/include); the first such folder is printed after the runtime's.
--wheels-only skips the system folders (tests/python/test_build.py checks the fallback with it).
"""
import glob
import os
import sys
import sysconfig


def has(folder, header):
    return os.path.isfile(os.path.join(folder, header))


def main():
    system = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    system.append("/usr/local/cuda/include")
    if "--wheels-only" in sys.argv[1:]:
        system = []
    for folder in system:
        if has(folder, "cuda_runtime_api.h") and has(folder, "crt/host_defines.h"):
            print(folder)
            return 0
    sites = []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and path not in sites:
            sites.append(path)
    wheels = []
    for site in sites:
        for pattern in ("nvidia/cu*/include", "nvidia/cuda_runtime/include", "nvidia/cuda_nvcc/include",
                        "nvidia/cuda_crt/include", "triton/backends/nvidia/include"):
            wheels += sorted(glob.glob(os.path.join(site, pattern)))
    runtime = next((f for f in wheels if has(f, "cuda_runtime_api.h")), None)
    if runtime is None:
        return 0
    print(runtime)
    if not has(runtime, "crt/host_defines.h"):
        crt = next((f for f in wheels if has(f, "crt/host_defines.h")), None)
        if crt is not None:
            print(crt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
