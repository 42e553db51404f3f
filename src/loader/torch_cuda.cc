#include "loader/torch_cuda.h"

#include <optional>

#include "loader/stream.h"
#include "loader/tensors.h"

#if ZCKPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zckpt::loader {

LoadStats StreamChunksForTorch(const Container& c, const Destinations& d, const LoadOptions& o,
                               const std::vector<int>& cuda_devices, const StagingHooks& staging) {
  std::vector<CudaDevice> devices;
#if ZCKPT_WITH_CUDA
  std::optional<c10::cuda::CUDAGuard> guard;
  if (!cuda_devices.empty()) guard.emplace(static_cast<c10::DeviceIndex>(cuda_devices[0]));
  for (int index : cuda_devices) {
    auto stream = WithTorchErrors([&] { return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)); });
    devices.push_back(CudaDevice{index, stream.stream()});
  }
#else
  if (!cuda_devices.empty())
    throw Error(ErrorKind::kUnsupported, "zckpt was built without CUDA: cannot load to a CUDA device");
#endif
  return StreamChunks(c, d, o, devices, staging);
}

}  // namespace zckpt::loader
