// CUDA runtime errors as zckpt::Error, for the CUDA engine and its pinned cache (torch-free).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "zckpt/error.h"

namespace zckpt::loader {

// Throws Error naming `what` unless `e` is cudaSuccess: kOutOfMemory for an allocation that
// failed (pinned or device memory), kIo otherwise.
inline void CudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a sticky-free error so later calls are not blamed
  throw Error(e == cudaErrorMemoryAllocation ? ErrorKind::kOutOfMemory : ErrorKind::kIo,
              std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// Makes `device` current on this thread unless it already is. Never switches back: see
// MakeCudaCopyEngine.
inline void UseDevice(int device) {
  int current = -1;
  CudaCheck(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) CudaCheck(cudaSetDevice(device), "cudaSetDevice");
}

}  // namespace zckpt::loader
