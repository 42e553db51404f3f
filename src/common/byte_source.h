// Bytes that are not a local file: what a MappedFile reads through when its container lives
// elsewhere (an object in S3-compatible storage: src/remote). There is no mapping and no
// descriptor; every byte comes from ReadAt into the caller's memory, so checks hold the same way
// as for pread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zckpt {

// Source bytes [offset, offset + n) wanted at dst.
struct ByteExtent {
  uint64_t offset, n;
  void* dst;
};

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Size when opened (fixed: a source pins the version it opened).
  virtual uint64_t size() const = 0;
  // The name errors use ("s3://bucket/key").
  virtual const std::string& name() const = 0;
  // Copies [offset, offset + n) into dst, all of it or Error(kIo) naming the source and the
  // range (after whatever retries the source makes). Thread-safe: loader threads call it at once.
  virtual void ReadAt(uint64_t offset, uint64_t n, void* dst) const = 0;
  // ReadAt of every extent (in source order, not overlapping), however the source groups them:
  // an object merges near neighbours and splits large ones into requests run at once.
  virtual void ReadExtents(const std::vector<ByteExtent>& extents) const {
    for (const ByteExtent& e : extents) ReadAt(e.offset, e.n, e.dst);
  }
  // A hint: [offset, offset + n) will be read soon (a tensor stream's next tensors). A source
  // may start fetching it now and hold it, within a budget of its own, until it is read.
  // False: not taken now (the budget is full), ask again later.
  virtual bool Prefetch(uint64_t offset, uint64_t n) const {
    (void)offset;
    (void)n;
    return true;
  }
  // Attempts a reader may make to fetch one checksummed range again when its bytes fail their
  // checksum (a local file: 1, its bytes would be the same).
  virtual unsigned refetch_attempts() const { return 1; }
  // Reader threads a loader should use at least (an object: each hands its reads to the
  // source, which runs them as parallel requests).
  virtual unsigned connections() const { return 1; }
  // Waits before attempt `attempt` (1-based retry count) of a re-fetch.
  virtual void BackoffBeforeRetry(unsigned attempt) const { (void)attempt; }
};

}  // namespace zckpt
