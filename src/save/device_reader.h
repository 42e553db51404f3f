// Reading device memory out chunk by chunk through a small pinned ring: device -> pinned slot ->
// sink, never a host copy of a whole storage. Copies run on a CUDA stream of ours that first
// waits for the caller's stream on that device (torch's current stream: kernels still writing the
// tensor finish first), up to `slots` copies in flight while the sink consumes the oldest.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

struct CUstream_st;  // cudaStream_t, named without the CUDA headers

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

// The caller's stream on CUDA device `device`, which the reader's copies there wait for (nullptr:
// the legacy default stream).
using StreamToWaitFor = std::function<CUstream_st*(int device)>;

// The CUDA runtime is loaded here (common/cudart_loader.h): Error(kUnsupported) naming what was
// searched when there is none. The pinned ring is taken at the first Read and kept for the next
// save. The reader makes devices current as it needs them and does not switch back (as the
// loader's engine: restoring could create a context on an untouched device); callers hold their
// own device guard (torch's).
std::unique_ptr<DeviceReader> MakeCudaReader(unsigned slots, uint64_t slot_bytes, StreamToWaitFor wait_for);

}  // namespace zckpt::save
