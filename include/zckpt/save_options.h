// The options and statistics of a save (zckpt/save.h), without torch: what the torch-free core
// that writes a torch.save pickle and its storages takes and reports too.
#pragma once

#include <cstdint>

#include "zckpt/container_writer.h"

namespace zckpt {

struct SaveOptions {
  // chunk_bytes, zstd_level (0: raw, the default; 1..22 per chunk, a chunk kept raw when zstd
  // does not shrink it), threads hashing/compressing (0: hardware concurrency), alignments.
  WriterOptions writer;
  // The pinned ring CUDA storages pass through: slots x slot_bytes of page-locked host memory
  // (default 4 x 8 MiB), allocated only when a storage is on a CUDA device.
  unsigned cuda_slots = 4;
  uint64_t cuda_slot_bytes = 8ull << 20;
};

struct SaveStats {
  WriterStats written;
  uint64_t storages = 0;
  uint64_t tensors = 0;
  uint64_t cuda_bytes = 0;       // storage bytes that came from CUDA devices through the ring
  uint64_t cuda_ring_bytes = 0;  // pinned host memory of the ring (0 when no CUDA storage)
  double seconds = 0;
};

}  // namespace zckpt
