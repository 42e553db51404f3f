// Moves delivered slot bytes to device destinations, and says when a slot may be refilled.
//
// Host destinations are plain memcpy done by the pipeline itself; an engine exists for what the
// host cannot do synchronously: the CUDA engine issues cudaMemcpyAsync on its own stream per
// device and records an event per slot, so a slot returns to the readers only once the copies
// reading it have finished, while the next slots are already being filled.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace zckpt::loader {

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;

  // Ring memory: 4 KiB-aligned host memory (the CPU engine), pinned host memory (CUDA engine,
  // so copies are true DMA and can overlap reads). Throws Error(kIo) on failure.
  virtual uint8_t* AllocateHost(uint64_t bytes) = 0;
  virtual void FreeHost(uint8_t* p) noexcept = 0;

  // Starts copying host `src` (inside a slot) to device memory `dst` on CUDA device `device`.
  virtual void CopyToDevice(const uint8_t* src, uint8_t* dst, uint64_t bytes, int device) = 0;
  // Every copy reading slot `slot` has been issued.
  virtual void EndSlot(unsigned slot) = 0;
  // Appends the slots whose copies have completed, oldest first. With `wait`, blocks until at
  // least one completes when any is in flight.
  virtual void Reclaim(bool wait, std::vector<unsigned>* done) = 0;
  virtual bool HasInFlight() const = 0;
  // Waits for every issued copy (also on error paths, before destinations can be freed).
  virtual void Synchronize() = 0;
};

std::unique_ptr<CopyEngine> MakeCpuCopyEngine();
// `devices`: CUDA device indices destinations live on; `slots`: ring size. Makes each of its
// streams wait for torch's current stream on that device, so memory the caching allocator just
// handed out (or a target still being produced) is not written early. Throws
// Error(kUnsupported) in a build without CUDA, Error(kIo) on CUDA errors.
std::unique_ptr<CopyEngine> MakeCudaCopyEngine(const std::vector<int>& devices, unsigned slots);

}  // namespace zckpt::loader
