// Host and device memory figures the tests and benchmarks measure a load by. Not needed to load
// anything (zckpt/loader.h). The host figures need no torch (the `zckpt load` command reports
// them; its device figures are load_ranges.h's ReadCudaMemory); the device figures below are
// torch's caching allocator's, in libzckpt.
#pragma once

#include <cstdint>

namespace zckpt {

struct HostMemory {
  uint64_t rss = 0;   // VmRSS, bytes
  uint64_t peak = 0;  // VmHWM, bytes
};
HostMemory ReadHostMemory();  // from /proc/self/status; zeros where unavailable
// Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs); false when refused.
bool ResetHostPeak();

// On a nearly full card what decides success is what the caching allocator reserves (its
// segments, rounded up) and what the driver has left (cudaMemGetInfo), not the bytes in tensors:
// report all three.
struct DeviceMemory {
  bool available = false;  // false without CUDA (build or device)
  uint64_t allocated = 0;       // torch caching allocator: bytes in tensors
  uint64_t peak_allocated = 0;  // since the last ResetDevicePeak
  uint64_t reserved = 0;        // segments the allocator holds (allocated + cached + rounding)
  uint64_t peak_reserved = 0;   // since the last ResetDevicePeak
  uint64_t free = 0, total = 0; // cudaMemGetInfo: the whole device, every process
};
DeviceMemory ReadDeviceMemory(int device);
void ResetDevicePeak(int device);
bool CudaAvailable();  // built with CUDA and at least one device present

}  // namespace zckpt
