// cudasim: a simulated, asynchronous CUDA runtime for tests (libzckpt_cudasim.so).
//
// It implements, with the real signatures of cuda_runtime_api.h, the runtime calls the copy
// engine and its tests make, and checks the rules a real GPU would punish silently:
//   - each stream runs its work on a thread of its own, each piece after a random delay
//     (0..max_delay_us); events complete when the work recorded before them has;
//   - a cudaMemcpyAsync reads its source when it EXECUTES; its source must be pinned memory, and
//     the copy is a violation if that memory was freed, or its bytes changed, between enqueue and
//     execution (a ring slot refilled before its copy ran); device-to-host ones (a save's ring)
//     must target pinned memory and write it only when they run;
//   - with Config::pageable_access, the source may be pageable memory too (a file's mapping);
//   - an event recorded on a stream of another device is an error (cudaErrorInvalidResourceHandle);
//   - cudaHostAlloc/cudaFreeHost/cudaFree synchronize (every stream, counted as implicit syncs);
//   - the legacy default stream (0) serializes with the blocking streams of its device;
//   - cudaSetDevice creates the device's primary context (CUDA 12+), cudaGetDevice does not.
// Device memory is host memory the simulator tracks per device (cudaMemGetInfo reports it).
// Every violation is printed to stderr at once and kept for TakeViolations().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cudasim {

struct Config {
  int devices = 1;
  uint64_t device_bytes = 1ull << 30;  // per device; cudaMalloc fails beyond it
  uint64_t pinned_bytes = 0;           // pinned host memory limit (0: none)
  unsigned max_delay_us = 300;         // each stream operation waits 0..this before it runs
  // Devices read pageable host memory through the host's page tables (Grace Hopper):
  // cudaDeviceGetAttribute says 1 for cudaDevAttrPageableMemoryAccess (88) and
  // ...UsesHostPageTables (100), and a cudaMemcpyAsync may read any host memory, still checked
  // for bytes rewritten between enqueue and execution. Otherwise both say 0 and such a source
  // is a violation. A process that never calls Reset starts with ZCKPT_SIM_PAGEABLE_ACCESS=1's.
  bool pageable_access = false;
  uint64_t seed = 1;
};

// Back to a fresh process's state under `config`: no contexts, no streams, nothing allocated,
// counters zero, every thread's current device 0. False (and a violation naming them) while any
// stream, event or allocation is still alive.
bool Reset(const Config& config);

struct DeviceCounters {
  bool context = false;           // the primary context exists
  uint64_t contexts_created = 0;
  uint64_t used_bytes = 0;        // cudaMalloc'd, in 2 MiB pages
  uint64_t streams_alive = 0;
  uint64_t events_alive = 0;
  uint64_t copies = 0;            // host-to-device copies executed
  uint64_t copy_bytes = 0;
  uint64_t pageable_copy_bytes = 0;  // of copy_bytes, read from pageable (not pinned) memory
};

struct Counters {
  std::vector<DeviceCounters> devices;
  uint64_t pinned_allocs = 0;     // cudaHostAlloc / cudaMallocHost
  uint64_t pinned_frees = 0;      // cudaFreeHost
  uint64_t pinned_live_bytes = 0;
  uint64_t implicit_syncs = 0;    // whole-device waits a call imposed (pinned alloc/free, cudaFree)
};
Counters Read();

// The misuses caught since the last call, oldest first; clears them.
std::vector<std::string> TakeViolations();

}  // namespace cudasim

// The same figures for tests that load the simulator from another language (ctypes in
// tests/python/test_core_cuda.py): host-to-device bytes copied to `device` so far, and the
// violations caught so far (not cleared).
extern "C" uint64_t cudasim_copy_bytes(int device);
extern "C" uint64_t cudasim_pageable_copy_bytes(int device);  // of those, from pageable memory
extern "C" uint64_t cudasim_pinned_allocs();
extern "C" uint64_t cudasim_violation_count();
