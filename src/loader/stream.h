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

// Checks `o` against the file (Error(kInvalidArgument) for zero slots/threads); returns the
// slot size to use: 0 -> max(chunk_bytes, 8 MiB), else rounded up to 4 KiB and to chunk_bytes.
uint64_t ResolveSlotBytes(const LoadOptions& o, uint64_t chunk_bytes);

// `cuda_devices`: devices some destination lives on, with the stream to wait for on each (empty:
// the CPU engine; torch callers use StreamChunksForTorch, torch_cuda.h). Fills the pipeline
// fields of LoadStats (not storages/tensors/seconds).
LoadStats StreamChunks(const Container& c, const Destinations& d, const LoadOptions& o,
                       const std::vector<CudaDevice>& cuda_devices, const StagingHooks& staging = {});

}  // namespace zckpt::loader
