// Reads a batch of chunks from the container, checking each chunk as it lands: into a ring
// slot, or straight into host destinations. Thread-safe: every reader thread shares one.
#pragma once

#include <cstdint>

#include "zckpt/load_options.h"

namespace zckpt {
class Container;
}

namespace zckpt::loader {

struct Batch;
class Destinations;
struct Plan;

class ChunkReader {
 public:
  // `method` is resolved (not kAuto). pread reads the container's own descriptor (never the path
  // again); kDirect reopens that descriptor with O_DIRECT and falls back to plain pread where the
  // filesystem refuses it; method() says which is in use. kMmap copies out of the container's
  // mapping with GuardedCopy. Every method ends a read of a file that shrank with Error(kIo)
  // naming it; every byte is hashed where it landed (slot or destination).
  ChunkReader(const Container& c, ReadMethod method, bool verify);
  ~ChunkReader();
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  ReadMethod method() const { return method_; }

  // Reads batch `b` of `plan`: into `slot` (slot batches, raw bytes at plan.slot_offset) or into
  // the destinations of its chunks. Throws Error(kCorrupt) naming the chunk
  // (Container::DescribeChunk) on a checksum or zstd failure, Error(kIo) on read errors.
  void Read(const Batch& b, const Plan& plan, const Destinations& d, uint8_t* slot) const;

 private:
  // Reads file bytes [offset, offset + len) into dst; returns the bytes read (less only at EOF).
  uint64_t ReadFile(uint64_t offset, uint64_t len, uint8_t* dst) const;
  // Reads file bytes [begin, end) into dst (chunk i's bytes land at dst + offset_i - begin) in
  // pieces, hashing each needed chunk of [first, last) as its bytes arrive, while they are still
  // in cache: one pass over memory instead of a read pass then a hash pass.
  void ReadSpan(uint64_t begin, uint64_t end, uint8_t* dst, uint64_t first, uint64_t last,
                const Destinations& d) const;
  void ReadDirect(const Batch& b, const Destinations& d) const;

  const Container& c_;
  ReadMethod method_;
  bool verify_;
  int fd_ = -1;         // the container's descriptor, or direct_fd_
  int direct_fd_ = -1;  // owned: the O_DIRECT reopening
};

}  // namespace zckpt::loader
