// The torch side of the CUDA path: what the torch-free copy engine is handed (torch's current
// stream on each device) and the device guard around a load.
#pragma once

#include <vector>

#include "loader/pipeline.h"
#include "zckpt/load_options.h"

namespace zckpt {
class Container;
}

namespace zckpt::loader {

class Destinations;

// StreamChunks (stream.h) for the torch-facing loaders. `cuda_devices`: the device indices
// destinations live on; the engine's streams wait for torch's current stream on each. The load
// runs under torch's device guard (c10::cuda::CUDAGuard), which gives the caller's device back the
// way torch does (MaybeSetDevice: a device without a primary context is not made current again,
// so loading to cuda:1 never creates a context, ~0.5 GiB, on an untouched cuda:0).
LoadStats StreamChunksForTorch(const Container& c, const Destinations& d, const LoadOptions& o,
                               const std::vector<int>& cuda_devices, const StagingHooks& staging = {});

}  // namespace zckpt::loader
