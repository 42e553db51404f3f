// zckpt/load_ranges.h's memory: LoadBuffer on the host or a CUDA device, and the device figures
// the `zckpt load` command reports, through the CUDA runtime loaded at run time.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "common/cudart_loader.h"
#include "loader/plan.h"
#include "zckpt/error.h"
#include "zckpt/load_ranges.h"

namespace zckpt {

namespace {

// Device memory is zeroed from a host page of zeros this large, one copy after another.
constexpr size_t kZeroCopyBytes = 8u << 20;

// Makes `device` current after checking the runtime has it.
const CudaRuntime& UseCudaDevice(int device) {
  const CudaRuntime& cuda = Cuda();
  int count = CudaDeviceCount();
  if (device < 0 || device >= count)
    throw Error(ErrorKind::kInvalidArgument, "no CUDA device " + std::to_string(device) + ": the runtime " +
                                                 cuda.path + " sees " + std::to_string(count));
  UseDevice(cuda, device);
  return cuda;
}

}  // namespace

LoadBuffer::LoadBuffer(uint64_t bytes, int device) : bytes_(bytes), device_(device) {
  if (device < 0) {  // aligned for O_DIRECT reads straight into it
    const size_t rounded = (bytes + loader::kDirectIoAlign - 1) / loader::kDirectIoAlign * loader::kDirectIoAlign;
    data_ = static_cast<uint8_t*>(std::aligned_alloc(loader::kDirectIoAlign, rounded ? rounded : loader::kDirectIoAlign));
    if (!data_) throw Error(ErrorKind::kOutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return;
  }
  const CudaRuntime& cuda = UseCudaDevice(device);
  void* p = nullptr;
  CudaCheck(cuda, cuda.Malloc(&p, bytes ? bytes : 1),
            "cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(device));
  data_ = static_cast<uint8_t*>(p);
}

LoadBuffer::~LoadBuffer() {
  if (device_ < 0) {
    std::free(data_);
  } else if (data_) {
    // Never throws: the runtime is loaded (the buffer came from it), and a failing call leaves
    // the memory to the process's end rather than ending the process.
    const CudaRuntime& cuda = Cuda();
    int current = -1;
    if (cuda.GetDevice(&current) == kCudaSuccess && current != device_) (void)cuda.SetDevice(device_);
    (void)cuda.Free(data_);
  }
}

void LoadBuffer::Zero() {
  if (device_ < 0) {
    std::memset(data_, 0, bytes_);
    return;
  }
  const CudaRuntime& cuda = UseCudaDevice(device_);
  std::vector<uint8_t> zeros(std::min<uint64_t>(bytes_, kZeroCopyBytes), 0);
  for (uint64_t done = 0; done < bytes_; done += zeros.size()) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(), bytes_ - done));
    CudaCheck(cuda, cuda.Memcpy(data_ + done, zeros.data(), n, kCudaMemcpyHostToDevice), "cudaMemcpy (zeroing)");
  }
}

int CudaDeviceCount() {
  const CudaRuntime& cuda = Cuda();
  int n = 0;
  CudaCheck(cuda, cuda.GetDeviceCount(&n), "cudaGetDeviceCount (" + cuda.path + ")");
  return n;
}

CudaMemory ReadCudaMemory(int device) {
  const CudaRuntime& cuda = UseCudaDevice(device);
  size_t free = 0, total = 0;
  CudaCheck(cuda, cuda.MemGetInfo(&free, &total), "cudaMemGetInfo");
  return {free, total};
}

}  // namespace zckpt
