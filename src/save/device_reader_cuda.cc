#include <string>

#include "save/device_reader.h"
#include "zckpt/error.h"

#if ZCKPT_WITH_CUDA
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <deque>
#include <map>
#include <vector>
#endif

namespace zckpt::save {

#if ZCKPT_WITH_CUDA

namespace {

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw Error(ErrorKind::kIo, std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

class CudaReader final : public DeviceReader {
 public:
  CudaReader(unsigned slots, uint64_t slot_bytes) : slots_(slots), slot_bytes_(slot_bytes) {
    if (slots == 0 || slot_bytes == 0) throw Error(ErrorKind::kInvalidArgument, "the CUDA ring needs slots of some bytes");
  }
  ~CudaReader() override {
    for (auto& [device, d] : devices_) {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      (void)cudaStreamSynchronize(d.stream);
      for (cudaEvent_t e : d.events) (void)cudaEventDestroy(e);
      (void)cudaEventDestroy(d.ready);
      (void)cudaStreamDestroy(d.stream);
    }
  }

  uint64_t ring_bytes() const override { return ring_.defined() ? static_cast<uint64_t>(ring_.numel()) : 0; }

  void Read(const void* src, uint64_t bytes, int device,
            const std::function<void(std::span<const uint8_t>)>& sink) override {
    if (bytes == 0) return;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    PerDevice& d = Device(device);
    if (!ring_.defined())  // pinned, from torch's caching host allocator (reused by the next save)
      ring_ = at::empty({static_cast<int64_t>(uint64_t{slots_} * slot_bytes_)},
                        at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    // Our stream waits for whatever torch's current stream still has queued on this device.
    Check(cudaEventRecord(d.ready, c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()),
          "cudaEventRecord");
    Check(cudaStreamWaitEvent(d.stream, d.ready, 0), "cudaStreamWaitEvent");
    auto* host = static_cast<uint8_t*>(ring_.data_ptr());
    const auto* from = static_cast<const uint8_t*>(src);
    struct Piece {
      unsigned slot;
      uint64_t bytes;
    };
    std::deque<Piece> in_flight;
    uint64_t issued = 0;
    unsigned next_slot = 0;
    try {
      while (issued < bytes || !in_flight.empty()) {
        while (issued < bytes && in_flight.size() < slots_) {
          uint64_t n = std::min(slot_bytes_, bytes - issued);
          unsigned slot = next_slot;
          next_slot = (next_slot + 1) % slots_;
          Check(cudaMemcpyAsync(host + uint64_t{slot} * slot_bytes_, from + issued, n, cudaMemcpyDeviceToHost, d.stream),
                "cudaMemcpyAsync (device to pinned host)");
          Check(cudaEventRecord(d.events[slot], d.stream), "cudaEventRecord");
          in_flight.push_back({slot, n});
          issued += n;
        }
        Piece p = in_flight.front();
        Check(cudaEventSynchronize(d.events[p.slot]), "cudaEventSynchronize");
        in_flight.pop_front();
        sink(std::span<const uint8_t>(host + uint64_t{p.slot} * slot_bytes_, p.bytes));
      }
    } catch (...) {
      (void)cudaStreamSynchronize(d.stream);  // no copy may still write the ring
      throw;
    }
  }

 private:
  struct PerDevice {
    cudaStream_t stream = nullptr;
    cudaEvent_t ready = nullptr;
    std::vector<cudaEvent_t> events;  // one per slot
  };

  PerDevice& Device(int device) {
    auto it = devices_.find(device);
    if (it != devices_.end()) return it->second;
    PerDevice d;
    Check(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    devices_[device] = d;  // destroyed with the reader even if an event fails below
    PerDevice& kept = devices_[device];
    Check(cudaEventCreateWithFlags(&kept.ready, cudaEventDisableTiming), "cudaEventCreate");
    for (unsigned s = 0; s < slots_; ++s) {
      cudaEvent_t e = nullptr;
      Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      kept.events.push_back(e);
    }
    return kept;
  }

  const unsigned slots_;
  const uint64_t slot_bytes_;
  at::Tensor ring_;
  std::map<int, PerDevice> devices_;
};

}  // namespace

std::unique_ptr<DeviceReader> MakeCudaReader(unsigned slots, uint64_t slot_bytes) {
  return std::make_unique<CudaReader>(slots, slot_bytes);
}

#else

std::unique_ptr<DeviceReader> MakeCudaReader(unsigned, uint64_t) {
  throw Error(ErrorKind::kUnsupported, "a storage is on a CUDA device, but this build of zckpt has no CUDA");
}

#endif

}  // namespace zckpt::save
