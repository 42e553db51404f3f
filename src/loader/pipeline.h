// Runs a plan: reader threads take batches in order, fill ring slots (or host destinations) and
// hand them to the calling thread, which delivers each slot's pieces (memcpy to host, the copy
// engine to devices) and gives slots back as their copies complete.
//
// Stopping: the first error on any thread (or the cancel flag) closes both queues, which wakes
// every waiter; then readers are joined and device copies synchronized before the error is
// rethrown on the calling thread, so nothing is left running and no buffer is freed under a copy.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "loader/time_split.h"

namespace zckpt::loader {

class ChunkReader;
class CopyEngine;
class Destinations;
struct Plan;

struct PipelineConfig {
  unsigned threads = 1;
  unsigned slots = 1;
  uint64_t slot_capacity = 0;
  std::function<void(uint64_t, uint64_t)> progress;
  const std::atomic<bool>* cancel = nullptr;
};

// LoadInto's staging buffers: `buffer(id)` gives (allocating on first use) the host buffer of
// staging id; `complete(id)` runs once all of its bytes have arrived. Both on the calling thread.
struct StagingHooks {
  std::function<uint8_t*(uint32_t)> buffer;
  std::function<void(uint32_t)> complete;
};

struct PipelineStats {
  uint64_t ring_bytes = 0;
  unsigned slots = 0;
  unsigned threads = 0;
};

// Time spent copying slots out and waiting is added to `split` (the reader adds its own).
PipelineStats RunPipeline(const Plan& plan, const Destinations& d, const ChunkReader& reader,
                          CopyEngine& engine, const PipelineConfig& config, TimeSplit& split,
                          const StagingHooks& staging = {});

}  // namespace zckpt::loader
