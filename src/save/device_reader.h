// Reading device memory out chunk by chunk through a small pinned ring: device -> pinned slot ->
// sink, never a host copy of a whole storage. Copies run on a CUDA stream of ours that first
// waits for torch's current stream on that device (so kernels still writing the tensor finish
// first), up to `slots` copies in flight while the sink consumes the oldest.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

namespace zckpt::save {

class DeviceReader {
 public:
  virtual ~DeviceReader() = default;
  // Hands [src, src + bytes) of CUDA device `device` to `sink` in order, in pieces of at most
  // slot_bytes. Every copy is finished when it returns or throws (Error kIo on a CUDA error;
  // whatever `sink` throws).
  virtual void Read(const void* src, uint64_t bytes, int device,
                    const std::function<void(std::span<const uint8_t>)>& sink) = 0;
  // Page-locked host memory held (slots x slot_bytes).
  virtual uint64_t ring_bytes() const = 0;
};

// Error(kUnsupported) in a build without CUDA; the pinned ring is allocated here (through
// torch's caching host allocator, so repeated saves reuse it).
std::unique_ptr<DeviceReader> MakeCudaReader(unsigned slots, uint64_t slot_bytes);

}  // namespace zckpt::save
