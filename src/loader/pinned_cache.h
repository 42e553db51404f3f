// Pinned host memory kept across CUDA loads (torch-free; the runtime through cudart_loader.h).
//
// cudaHostAlloc page-locks memory, which synchronizes the device, and cudaFreeHost synchronizes
// it too: a load that allocated and freed its ring on every call would stall the NCCL and compute
// streams beside it on every call. Ring slots are taken from this cache and given back when the
// load ends; up to the limit, given-back buffers stay pinned for the next load, anything beyond
// it is freed at once.
//
// Limit: 256 MiB by default (three times the default ring of a 16-core host, 10 slots of
// 8 MiB + 8 KiB), or ZCKPT_PINNED_CACHE_MB (MiB, read once; 0: nothing is kept). Cached
// buffers are never freed at exit, when the CUDA runtime may already be gone; the process's end
// releases them.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

namespace zckpt::loader {

class PinnedCache {
 public:
  static constexpr uint64_t kDefaultLimit = 256ull << 20;

  static PinnedCache& Global();

  // A pinned, portable (usable from every device) buffer of at least `bytes`: a cached one
  // holding at most twice that, else a new cudaHostAlloc made with the current device.
  // Throws Error(kOutOfMemory) when the memory cannot be pinned, Error(kIo) on other errors.
  uint8_t* Take(uint64_t bytes);
  // `p` (from Take, no copy reading it any more) back to the cache, or freed beyond the limit.
  void Give(uint8_t* p) noexcept;
  // Frees cached buffers, oldest first, until at most `keep` bytes stay cached.
  void Trim(uint64_t keep) noexcept;
  void set_limit(uint64_t bytes);

  struct Stats {
    uint64_t cached_bytes = 0;  // pinned, waiting for the next load
    uint64_t in_use_bytes = 0;  // taken by loads running now
    uint64_t allocations = 0;   // cudaHostAlloc calls so far
    uint64_t frees = 0;         // cudaFreeHost calls so far
  };
  Stats stats() const;

 private:
  PinnedCache();
  void TrimLocked(uint64_t keep) noexcept;

  struct Buffer {
    uint64_t bytes = 0;
    bool in_use = false;
    uint64_t given_back = 0;  // order of return, for oldest-first trimming
  };
  mutable std::mutex mutex_;
  std::map<uint8_t*, Buffer> buffers_;
  uint64_t limit_;
  uint64_t returns_ = 0;
  Stats stats_;
};

}  // namespace zckpt::loader
