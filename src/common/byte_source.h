// Bytes that are not a local file: what a MappedFile reads through when its container lives
// elsewhere (an object in S3-compatible storage: src/remote). There is no mapping and no
// descriptor; every byte comes from ReadAt into the caller's memory, so checks hold the same way
// as for pread.
#pragma once

#include <cstdint>
#include <string>

namespace zckpt {

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
  // Attempts a reader may make to fetch one checksummed range again when its bytes fail their
  // checksum (a local file: 1, its bytes would be the same).
  virtual unsigned refetch_attempts() const { return 1; }
  // Reader threads (connections) a loader should use at least.
  virtual unsigned connections() const { return 1; }
  // Waits before attempt `attempt` (1-based retry count) of a re-fetch.
  virtual void BackoffBeforeRetry(unsigned attempt) const { (void)attempt; }
};

}  // namespace zckpt
