// Reads a batch of chunks from the container, checking each chunk as it lands: into a ring
// slot, or straight into host destinations; or checks it where it lies in the file's mapping,
// for devices that copy from there (CopyFromMapping). Thread-safe: every reader thread shares one.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "loader/time_split.h"
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
  // filesystem refuses it; method() says which is in use. With kPread and
  // `direct_when_uncached`, ranges read straight into CPU destinations whose pages are not in
  // the page cache (mincore) are read with O_DIRECT instead (the same reopening), several large
  // reads in flight (where the filesystem takes O_DIRECT; else everything goes through the page
  // cache). kMmap copies out of the container's mapping with GuardedCopy. Every method ends a read
  // of a file that shrank with Error(kIo) naming it; every byte is hashed where it landed (slot or
  // destination). Time spent reading and hashing is added to `split`.
  ChunkReader(const Container& c, ReadMethod method, bool verify, TimeSplit& split, bool direct_when_uncached = true);
  ~ChunkReader();
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  ReadMethod method() const { return method_; }
  // Bytes read with O_DIRECT because they were not in the page cache (direct_when_uncached).
  uint64_t uncached_bytes() const { return uncached_bytes_.load(); }

  // Reads batch `b` of `plan`: into `slot` (slot batches, raw bytes at plan.slot_offset) or into
  // the destinations of its chunks. Returns where the batch's bytes now are, as a slot would hold
  // them: `slot`, nullptr for a batch read into destinations, or, after CopyFromMapping(), the
  // file's mapping at the batch's first byte for a raw slot batch (checked there, nothing read).
  // Throws Error(kCorrupt) naming the chunk (Container::DescribeChunk) on a checksum or zstd
  // failure, Error(kIo) on read errors and, in the mapping, when the file shrank.
  const uint8_t* Read(const Batch& b, const Plan& plan, const Destinations& d, uint8_t* slot) const;

  // Raw slot batches stay in the container's mapping of a local file: the copy engine reads the
  // devices' bytes from there (a device that reads pageable host memory, copy_engine.h), so
  // nothing is copied into a ring slot. Not for objects, containers opened from memory, or
  // kDirect (asked for O_DIRECT); then nothing changes.
  void CopyFromMapping();
  // Whether Read leaves batch `b` in the mapping (CopyFromMapping, a raw slot batch).
  bool InMapping(const Batch& b) const;
  // Checks batch `b`, left in the mapping, again once the copies reading it have completed: bytes
  // rewritten in place between Read's check and the copy end the load with Error(kCorrupt) naming
  // the chunk, as a checksum failure does.
  void CheckAfterCopy(const Batch& b, const Destinations& d) const;

 private:
  // Reads file bytes [offset, offset + len) into dst; returns the bytes read (less only at EOF).
  uint64_t ReadFile(uint64_t offset, uint64_t len, uint8_t* dst) const;
  // Reads file bytes [begin, end) into dst (chunk i's bytes land at dst + offset_i - begin) in
  // pieces, each needed chunk of [first, last) fed to the chunk checker as its bytes arrive.
  void ReadSpan(uint64_t begin, uint64_t end, uint8_t* dst, uint64_t first, uint64_t last,
                const Destinations& d) const;
  // A batch read straight into its chunks' CPU destinations (no slot).
  void ReadIntoDestinations(const Batch& b, const Destinations& d) const;
  // Raw slot batch `b` checked where it lies in the mapping, under the SIGBUS guard; its start.
  const uint8_t* CheckInMapping(const Batch& b, const Destinations& d) const;
  // An object (s3://): each run of raw chunks adjacent in the object and in memory one ranged GET
  // into its slot place or destination, each chunk then checked (a bad one fetched again alone);
  // zstd chunks one GET each.
  void ReadRemote(const Batch& b, const Plan& plan, const Destinations& d, uint8_t* slot) const;
  // A run of raw chunks going whole to one CPU destination: file bytes [begin, end) -> dst,
  // chunks [first, last).
  struct DestinationSpan {
    uint64_t begin, end;
    uint8_t* dst;
    uint64_t first, last;
  };
  // Reads the spans in order, each window of bytes either through the page cache (cached) or
  // with O_DIRECT, queued (uncached); every chunk checked as its bytes land, in file order.
  void ReadDestinationSpans(const std::vector<DestinationSpan>& spans, const Destinations& d) const;
  // > 0: read [at, at + that) of span s with O_DIRECT (aligned, and not all in the page cache).
  uint64_t UncachedLength(const DestinationSpan& s, uint64_t at, uint64_t window) const;
  bool Resident(uint64_t offset, uint64_t len) const;
  // pread of [offset, offset + len) from fd into dst until done or end of file; the bytes read.
  uint64_t Pread(int fd, uint64_t offset, uint64_t len, uint8_t* dst) const;

  const Container& c_;
  ReadMethod method_;
  bool verify_;
  TimeSplit& split_;
  int fd_ = -1;           // the container's descriptor, or o_direct_fd_ (kDirect)
  int o_direct_fd_ = -1;  // owned: the O_DIRECT reopening (kDirect; with kPread, for uncached ranges)
  mutable std::atomic<uint64_t> uncached_bytes_{0};
  bool remote_ = false;
  bool slots_from_mapping_ = false;  // CopyFromMapping()
};

}  // namespace zckpt::loader
