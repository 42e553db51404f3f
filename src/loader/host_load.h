// Storages and byte ranges streamed into memory the caller owns: the torch-free loads that the
// Python module's `_core` (zckpt.load, load_into, iter_tensors) and the `zckpt load` command run.
// The caller allocates (the Python layer: torch's own allocator on the CPU or a CUDA device, or a
// LoadBuffer), this fills; nothing here knows torch.
#pragma once

#include <cstdint>
#include <vector>

#include "loader/copy_engine.h"
#include "zckpt/load_options.h"
#include "zckpt/load_ranges.h"

namespace zckpt {
class Container;
}

namespace zckpt::loader {

// zckpt::LoadRanges (load_ranges.h) with the stream each device's copies wait for given:
// `cuda_devices` holds every device a target names, with the caller's stream there (the Python
// layer passes torch's current stream; empty: host targets only, the CPU engine). A device not
// in `cuda_devices` is kInvalidArgument before any byte moves; the other errors are
// zckpt::LoadRanges'.
LoadStats LoadRanges(const Container& c, const std::vector<LoadTarget>& ranges, const LoadOptions& options,
                     const std::vector<CudaDevice>& cuda_devices = {});

}  // namespace zckpt::loader
