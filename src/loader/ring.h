// The ring: a fixed set of equally sized host buffers ("slots") that reader threads fill and
// the copy engine drains. Its size, not the file's, bounds the host memory of a load.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "loader/blocking_queue.h"

namespace zckpt::loader {

class CopyEngine;

class Ring {
 public:
  // `slots` buffers of `capacity` bytes from the engine's host allocator (pinned for CUDA).
  // slots == 0 makes an empty ring (nothing in the load needs one).
  Ring(CopyEngine& engine, unsigned slots, uint64_t capacity);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  unsigned slots() const { return static_cast<unsigned>(buffers_.size()); }
  uint64_t capacity() const { return capacity_; }
  uint64_t bytes() const { return capacity_ * buffers_.size(); }
  uint8_t* data(unsigned slot) const { return buffers_[slot]; }

  // A free slot, waiting for one; nullopt once closed.
  std::optional<unsigned> Acquire() { return free_.Pop(); }
  void Release(unsigned slot) { free_.Push(slot); }
  // Wakes every thread waiting in Acquire (stop).
  void Close() { free_.Close(); }

 private:
  CopyEngine& engine_;
  uint64_t capacity_;
  std::vector<uint8_t*> buffers_;
  BlockingQueue<unsigned> free_;
};

}  // namespace zckpt::loader
