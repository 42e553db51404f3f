// One streaming pass over a container: resolves the options, plans the batches, picks the copy
// engine and runs the pipeline. Load and LoadInto differ only in the Destinations they build.
#pragma once

#include <vector>

#include "loader/copy_engine.h"
#include "loader/pipeline.h"
#include "zckpt/load_options.h"

namespace zckpt {
class Container;
}

namespace zckpt::loader {

class Destinations;

// ResolveLoadSizes (zckpt/load_options.h) for container `c`: its chunk size, and the connections
// its source asks for when it is an object. Every load calls it before allocating, so bad
// options fail first.
LoadSizes ResolveContainerLoad(const LoadOptions& o, const Container& c);

// `cuda_devices`: devices some destination lives on, with the stream to wait for on each (empty:
// the CPU engine; torch callers use StreamChunksForTorch, torch_cuda.h). Fills the pipeline
// fields of LoadStats (not storages/tensors/seconds).
LoadStats StreamChunks(const Container& c, const Destinations& d, const LoadOptions& o,
                       const std::vector<CudaDevice>& cuda_devices, const StagingHooks& staging = {});

}  // namespace zckpt::loader
