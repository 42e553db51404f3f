// The CUDA runtime (libcudart), loaded when a load first needs it, never linked: one build of
// the torch-free core serves CPU-only machines and every CUDA major version, and the copy
// engine, its pinned cache and the command's device buffers all call the runtime through this
// table. tests/cudasim's simulated runtime is reached the same way (ZCKPT_CUDART names it), so
// what runs off-GPU is the code path a GPU runs.
//
// Which runtime: ZCKPT_CUDART when set (a file; nothing else is tried); else a libcudart already
// in the process (torch's, so there is one runtime: its streams, devices and pinned memory are
// ours); else the first that loads of the same names through the dynamic linker
// (LD_LIBRARY_PATH, /etc/ld.so.cache, the system folders), then in kCudaLibraryDirs.
//
// No CUDA header is included: the types are opaque pointers and the few enum values used are
// those of cuda_runtime_api.h, unchanged since CUDA 4.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

struct CUstream_st;  // cudaStream_t
struct CUevent_st;   // cudaEvent_t

namespace zckpt {

using CudaStream = CUstream_st*;
using CudaEvent = CUevent_st*;
using CudaStatus = int;  // cudaError_t

// cudaError_t values this code tells apart.
constexpr CudaStatus kCudaSuccess = 0;
constexpr CudaStatus kCudaErrorMemoryAllocation = 2;
constexpr CudaStatus kCudaErrorNotReady = 600;
// cudaMemcpyKind, cudaStreamNonBlocking, cudaEventDisableTiming, cudaHostAllocPortable.
constexpr int kCudaMemcpyHostToDevice = 1;
constexpr int kCudaMemcpyDeviceToHost = 2;
constexpr unsigned kCudaStreamNonBlocking = 1;
constexpr unsigned kCudaEventDisableTiming = 2;
constexpr unsigned kCudaHostAllocPortable = 1;
// cudaDeviceAttr values (driver_types.h, CUDA 9.2 and later): the device reads pageable host
// memory (malloc'd, a file's mapping) coherently without cudaHostRegister, and does so through
// the host's page tables (ATS: Grace Hopper's NVLink-C2C, POWER9's NVLink; not HMM over PCIe).
constexpr int kCudaDevAttrPageableMemoryAccess = 88;
constexpr int kCudaDevAttrPageableMemoryAccessUsesHostPageTables = 100;

// Sonames tried, newest first: libcudart's soname carries the CUDA major version (11.0 for 11.x).
inline const std::vector<std::string> kCudaRuntimeNames = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                                           "libcudart.so"};
// Searched after the dynamic linker: where a CUDA toolkit installs the runtime.
inline const std::vector<std::string> kCudaLibraryDirs = {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"};

// The runtime calls the loader makes, by their cudaXxx names without the prefix.
struct CudaRuntime {
  std::string path;  // the library the table came from, as dlinfo reports it
  CudaStatus (*GetDevice)(int*) = nullptr;
  CudaStatus (*SetDevice)(int) = nullptr;
  CudaStatus (*GetDeviceCount)(int*) = nullptr;
  CudaStatus (*GetLastError)() = nullptr;
  const char* (*GetErrorString)(CudaStatus) = nullptr;
  CudaStatus (*RuntimeGetVersion)(int*) = nullptr;
  CudaStatus (*HostAlloc)(void**, size_t, unsigned) = nullptr;
  CudaStatus (*FreeHost)(void*) = nullptr;
  CudaStatus (*Malloc)(void**, size_t) = nullptr;
  CudaStatus (*Free)(void*) = nullptr;
  CudaStatus (*Memcpy)(void*, const void*, size_t, int) = nullptr;
  CudaStatus (*MemcpyAsync)(void*, const void*, size_t, int, CudaStream) = nullptr;
  CudaStatus (*MemGetInfo)(size_t*, size_t*) = nullptr;
  CudaStatus (*DeviceGetAttribute)(int*, int, int) = nullptr;
  CudaStatus (*StreamCreateWithFlags)(CudaStream*, unsigned) = nullptr;
  CudaStatus (*StreamDestroy)(CudaStream) = nullptr;
  CudaStatus (*StreamSynchronize)(CudaStream) = nullptr;
  CudaStatus (*StreamWaitEvent)(CudaStream, CudaEvent, unsigned) = nullptr;
  CudaStatus (*EventCreateWithFlags)(CudaEvent*, unsigned) = nullptr;
  CudaStatus (*EventDestroy)(CudaEvent) = nullptr;
  CudaStatus (*EventRecord)(CudaEvent, CudaStream) = nullptr;
  CudaStatus (*EventQuery)(CudaEvent) = nullptr;
  CudaStatus (*EventSynchronize)(CudaEvent) = nullptr;
};

// The process's runtime, loaded by the first call (thread-safe; a failed search is repeated by
// the next call, so a library made available later is found). Throws Error(kUnsupported) naming
// every library tried and where when none loads, or the library and the missing function when
// one lacks a call above.
const CudaRuntime& Cuda();

// The search Cuda() makes, with its inputs explicit (tests): `forced` (ZCKPT_CUDART) when not
// empty, else `names` already loaded, then `names` through the dynamic linker, then in `dirs`.
// Returns a table that lives for the process.
const CudaRuntime& LoadCudaRuntime(const std::string& forced, const std::vector<std::string>& names,
                                   const std::vector<std::string>& dirs);

}  // namespace zckpt
