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

struct CUstream_st;  // cudaStream_t, named without the CUDA headers

namespace zckpt::loader {

// A CUDA device a load writes to, and the caller's stream on it whose queued work the load's
// copies must come after: the torch-facing layer passes torch's current stream (the caching
// allocator hands out blocks ordered on it, and a LoadInto target may still be being produced
// there), so the engine itself needs no torch. nullptr is the legacy default stream.
struct CudaDevice {
  int index = 0;
  CUstream_st* wait_for = nullptr;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;

  // Ring memory: host memory aligned to the O_DIRECT block (the CPU engine), pinned host memory
  // (CUDA engine, so copies are true DMA and can overlap reads; plain aligned memory where every
  // device reads pageable memory, below). Throws Error(kOutOfMemory) on failure.
  virtual uint8_t* AllocateHost(uint64_t bytes) = 0;
  virtual void FreeHost(uint8_t* p) noexcept = 0;

  // Whether every device of the load reads pageable host memory itself, through the host's page
  // tables (Grace Hopper; CUDA's cudaDevAttrPageableMemoryAccessUsesHostPageTables): then a
  // copy's source may be any host memory, the file's mapping included, and staging through
  // pinned memory buys nothing. False for the CPU engine.
  virtual bool ReadsPageableHost() const { return false; }

  // Starts copying host `src` (inside a slot, or pageable memory when ReadsPageableHost()) to
  // device memory `dst` on CUDA device `device`.
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
// The CPU engine's ring memory (kDirectIoAlign-aligned, plain host memory), also what the CUDA
// engine uses when its devices read pageable memory.
uint8_t* AllocateAlignedHost(uint64_t bytes);
void FreeAlignedHost(uint8_t* p) noexcept;
// `devices`: the CUDA devices destinations live on; `slots`: ring size. Each of its streams
// first waits for that device's `wait_for` stream, so memory just handed out (or a target still
// being produced) is not written early. Ring slots come from a per-process pinned cache
// (pinned_cache.h), so a load page-locks and frees nothing once the cache is warm.
// The engine makes devices current as it needs them (on the calling thread) and does not switch
// back: restoring with cudaSetDevice would create a primary context on an untouched device 0.
// The torch-facing caller holds torch's device guard around the load (torch_cuda.cc).
// Throws Error(kUnsupported) in a build without CUDA, Error(kOutOfMemory) when pinned memory
// cannot be had, Error(kIo) on other CUDA errors.
std::unique_ptr<CopyEngine> MakeCudaCopyEngine(const std::vector<CudaDevice>& devices, unsigned slots);

}  // namespace zckpt::loader
