// CUDA runtime errors as zckpt::Error, for the CUDA engine and its pinned cache (torch-free).
#pragma once

#include <string>

#include "common/cudart_loader.h"
#include "zckpt/error.h"

namespace zckpt {

// Throws Error naming `what` unless `e` is cudaSuccess: kOutOfMemory for an allocation that
// failed (pinned or device memory), kIo otherwise.
inline void CudaCheck(const CudaRuntime& cuda, CudaStatus e, const std::string& what) {
  if (e == kCudaSuccess) return;
  (void)cuda.GetLastError();  // clear a sticky-free error so later calls are not blamed
  const char* text = cuda.GetErrorString(e);
  throw Error(e == kCudaErrorMemoryAllocation ? ErrorKind::kOutOfMemory : ErrorKind::kIo,
              "CUDA error in " + what + ": " + (text ? text : "error " + std::to_string(e)));
}

// Makes `device` current on this thread unless it already is. Never switches back: see
// MakeCudaCopyEngine.
inline void UseDevice(const CudaRuntime& cuda, int device) {
  int current = -1;
  CudaCheck(cuda, cuda.GetDevice(&current), "cudaGetDevice");
  if (current != device) CudaCheck(cuda, cuda.SetDevice(device), "cudaSetDevice");
}

}  // namespace zckpt
