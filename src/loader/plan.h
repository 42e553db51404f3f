// What a load does, decided before any byte moves: where each chunk's bytes go (Destinations)
// and how chunks are grouped into units of work for the reader threads (Batches).
//
// A batch is a run of consecutive chunks (file order = chunk table order) handled by one reader
// at a time: either read into one ring slot (many small chunks share a slot; raw chunks are read
// with one read of the file span covering them), or read straight into host destinations (large
// raw chunks going whole to CPU memory: no slot, no memcpy).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "zckpt/format.h"

namespace zckpt {
class Container;
}

namespace zckpt::loader {

// Where part of a chunk's raw bytes go.
struct Piece {
  uint64_t chunk_offset = 0;  // within the chunk's raw bytes
  uint64_t bytes = 0;
  uint8_t* dst = nullptr;     // host or device address (unused when staged)
  int32_t device = -1;        // -1: host memory, else the CUDA device index of dst
  int32_t staged = -1;        // >= 0: goes to host staging buffer `staged` at staged_offset
  uint64_t staged_offset = 0;
};

class Destinations {
 public:
  explicit Destinations(uint64_t chunk_count) : begin_(chunk_count + 1, 0) {}
  // From (chunk, piece) pairs in any order.
  Destinations(uint64_t chunk_count, std::vector<std::pair<uint64_t, Piece>> pieces);

  // Appends a piece of `chunk`; chunks must come in non-decreasing order. Finish() after the
  // last one (the pairs constructor does it).
  void Add(uint64_t chunk, const Piece& piece);
  void Finish();
  std::span<const Piece> of(uint64_t chunk) const {
    return {pieces_.data() + begin_[chunk], pieces_.data() + begin_[chunk + 1]};
  }
  bool needed(uint64_t chunk) const { return begin_[chunk + 1] != begin_[chunk]; }
  uint64_t chunk_count() const { return begin_.size() - 1; }

  // Staging buffers (LoadInto's non-contiguous tensors): bytes each expects in total.
  std::vector<uint64_t> staged_bytes;

 private:
  std::vector<Piece> pieces_;
  std::vector<uint64_t> begin_;  // pieces of chunk i: [begin_[i], begin_[i+1])
  uint64_t next_ = 0;            // begin_[i] is final for i < next_
};

struct Batch {
  uint64_t first = 0, last = 0;  // chunks [first, last); chunks nobody needs are skipped
  bool in_slot = true;
  bool zstd = false;             // slot batches are all-raw or all-zstd
  uint64_t file_begin = 0;       // raw slot batches: file span read into the slot
  uint64_t file_end = 0;
  uint64_t raw_bytes = 0;        // raw bytes of the needed chunks
  uint64_t stored_bytes = 0;     // stored bytes of the needed chunks
};

struct PlanOptions {
  uint64_t slot_capacity = 0;  // bytes one slot holds
  uint64_t batch_bytes = 0;    // raw bytes per batch read straight into destinations
  bool align_spans = false;    // O_DIRECT: raw spans start and end on kDirectIoAlign boundaries
  bool read_into_destination = false;
};

struct Plan {
  std::vector<Batch> batches;
  std::vector<uint64_t> slot_offset;  // per chunk: where its raw bytes sit in the batch's slot
  uint64_t raw_bytes = 0;             // total delivered
  uint64_t stored_bytes = 0;          // total read (stored size of the needed chunks)
  uint64_t chunks = 0;                // needed chunks
  uint64_t slot_batches = 0;
  uint64_t destination_chunks = 0;
};

// What O_DIRECT needs buffer, file offset and length aligned to: the logical block (512 B or
// 4 KiB on every device here), a block size, not the page size (common/pages.h).
inline constexpr uint64_t kDirectIoAlign = 4096;
// Chunks of storages below this are packed in slots: one read for many small storages beats one
// each (64 KiB: the spec's large_threshold, where storages become block-aligned, large_alignment).
inline constexpr uint64_t kMinDirectStorage = 64 << 10;
// A gap of unneeded file bytes up to this is read through rather than starting a new batch.
inline constexpr uint64_t kMaxSpanGap = 64 << 10;

Plan MakePlan(const Container& c, const Destinations& d, const PlanOptions& options);

using format::IsZstd;

}  // namespace zckpt::loader
