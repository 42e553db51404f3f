#include "loader/pinned_cache.h"

#include <cstdlib>
#include <string>

#include "common/cuda_check.h"

namespace zckpt::loader {

PinnedCache& PinnedCache::Global() {
  static PinnedCache* cache = new PinnedCache;  // never destroyed: see the header
  return *cache;
}

PinnedCache::PinnedCache() : limit_(kDefaultLimit) {
  if (const char* mb = std::getenv("ZCKPT_PINNED_CACHE_MB"); mb != nullptr && *mb != '\0') {
    char* end = nullptr;
    unsigned long long v = std::strtoull(mb, &end, 10);
    if (end != nullptr && *end == '\0') limit_ = static_cast<uint64_t>(v) << 20;
  }
}

uint8_t* PinnedCache::Take(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Buffer* best = nullptr;
  uint8_t* best_p = nullptr;
  for (auto& [p, b] : buffers_) {
    if (b.in_use || b.bytes < bytes || b.bytes > 2 * bytes) continue;
    if (best == nullptr || b.bytes < best->bytes) best = &b, best_p = p;
  }
  if (best != nullptr) {
    best->in_use = true;
    stats_.cached_bytes -= best->bytes;
    stats_.in_use_bytes += best->bytes;
    return best_p;
  }
  void* p = nullptr;
  const CudaRuntime& cuda = Cuda();
  CudaCheck(cuda, cuda.HostAlloc(&p, bytes, kCudaHostAllocPortable),
            "cudaHostAlloc of a " + std::to_string(bytes) + "-byte pinned ring slot");
  ++stats_.allocations;
  stats_.in_use_bytes += bytes;
  buffers_[static_cast<uint8_t*>(p)] = Buffer{bytes, true, 0};
  return static_cast<uint8_t*>(p);
}

void PinnedCache::Give(uint8_t* p) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.find(p);
  if (it == buffers_.end() || !it->second.in_use) return;
  it->second.in_use = false;
  it->second.given_back = ++returns_;
  stats_.in_use_bytes -= it->second.bytes;
  stats_.cached_bytes += it->second.bytes;
  TrimLocked(limit_);
}

void PinnedCache::Trim(uint64_t keep) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  TrimLocked(keep);
}

void PinnedCache::TrimLocked(uint64_t keep) noexcept {
  while (stats_.cached_bytes > keep) {
    auto oldest = buffers_.end();
    for (auto it = buffers_.begin(); it != buffers_.end(); ++it)
      if (!it->second.in_use && (oldest == buffers_.end() || it->second.given_back < oldest->second.given_back))
        oldest = it;
    if (oldest == buffers_.end()) return;
    (void)Cuda().FreeHost(oldest->first);  // loaded: the buffer came from it
    ++stats_.frees;
    stats_.cached_bytes -= oldest->second.bytes;
    buffers_.erase(oldest);
  }
}

void PinnedCache::set_limit(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
  TrimLocked(limit_);
}

PinnedCache::Stats PinnedCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace zckpt::loader
