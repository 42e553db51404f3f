// Device memory figures of torch's caching allocator for the tests and the benchmarks (the host
// figures are torch-free: host_memory.cc).
#include "loader/tensors.h"
#include "zckpt/memory_stats.h"

#if ZCKPT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace zckpt {

bool CudaAvailable() {
#if ZCKPT_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

DeviceMemory ReadDeviceMemory(int device) {
  DeviceMemory m;
#if ZCKPT_WITH_CUDA
  if (!CudaAvailable()) return m;
  // An empty allocation initializes torch's CUDA state (and its caching allocator) if nothing has.
  (void)loader::AllocateBytes(0, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  m.allocated = static_cast<uint64_t>(stats.allocated_bytes[0].current);  // [0]: all pools
  m.peak_allocated = static_cast<uint64_t>(stats.allocated_bytes[0].peak);
  m.reserved = static_cast<uint64_t>(stats.reserved_bytes[0].current);
  m.peak_reserved = static_cast<uint64_t>(stats.reserved_bytes[0].peak);
  {
    // torch's guard gives the previous device back without creating a context on it.
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      m.free = free;
      m.total = total;
    }
    (void)cudaGetLastError();
  }
  m.available = true;
#else
  (void)device;
#endif
  return m;
}

void ResetDevicePeak(int device) {
#if ZCKPT_WITH_CUDA
  if (!CudaAvailable()) return;
  (void)loader::AllocateBytes(0, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
#else
  (void)device;
#endif
}

}  // namespace zckpt
