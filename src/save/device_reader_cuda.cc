// The CUDA device reader: device -> pinned ring slot -> sink, on a stream of ours per device that
// first waits for the caller's stream there. Torch-free: it calls the CUDA runtime
// src/common/cudart_loader.h loads at run time, so the Python module's `_core` and libzckpt_save
// (zckpt::Save) share it, and tests/cudasim runs it without a GPU.
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "save/device_reader.h"
#include "zckpt/error.h"

namespace zckpt::save {

namespace {

// The ring of the last save, kept pinned for the next: page-locking memory and cudaFreeHost each
// synchronize the device, which a trainer saving every N steps should not pay every time. Never
// freed at exit (the runtime may be gone by then); a larger ring replaces it.
struct KeptRing {
  std::mutex mutex;
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  bool in_use = false;
};

KeptRing& Kept() {
  static KeptRing* kept = new KeptRing;
  return *kept;
}

class CudaReader final : public DeviceReader {
 public:
  CudaReader(unsigned slots, uint64_t slot_bytes, StreamToWaitFor wait_for)
      : cuda_(Cuda()), slots_(slots), slot_bytes_(slot_bytes), wait_for_(std::move(wait_for)) {
    if (slots == 0 || slot_bytes == 0) throw Error(ErrorKind::kInvalidArgument, "the CUDA ring needs slots of some bytes");
  }
  ~CudaReader() override {
    for (auto& [device, d] : devices_) {
      try {
        UseDevice(cuda_, device);  // a device this reader used: it has its context already
      } catch (const Error&) {
      }
      (void)cuda_.StreamSynchronize(d.stream);
      for (CudaEvent e : d.events) (void)cuda_.EventDestroy(e);
      (void)cuda_.EventDestroy(d.ready);
      (void)cuda_.StreamDestroy(d.stream);
    }
    ReleaseRing();
  }

  uint64_t ring_bytes() const override { return ring_ != nullptr ? uint64_t{slots_} * slot_bytes_ : 0; }

  void Read(const void* src, uint64_t bytes, int device,
            const std::function<void(std::span<const uint8_t>)>& sink) override {
    if (bytes == 0) return;
    UseDevice(cuda_, device);
    PerDevice& d = Device(device);
    if (ring_ == nullptr) TakeRing();
    // Our stream waits for whatever the caller's stream still has queued on this device.
    CudaCheck(cuda_, cuda_.EventRecord(d.ready, wait_for_ ? wait_for_(device) : nullptr), "cudaEventRecord");
    CudaCheck(cuda_, cuda_.StreamWaitEvent(d.stream, d.ready, 0), "cudaStreamWaitEvent");
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
          CudaCheck(cuda_,
                    cuda_.MemcpyAsync(ring_ + uint64_t{slot} * slot_bytes_, from + issued, n, kCudaMemcpyDeviceToHost,
                                      d.stream),
                    "cudaMemcpyAsync (device to pinned host)");
          CudaCheck(cuda_, cuda_.EventRecord(d.events[slot], d.stream), "cudaEventRecord");
          in_flight.push_back({slot, n});
          issued += n;
        }
        Piece p = in_flight.front();
        CudaCheck(cuda_, cuda_.EventSynchronize(d.events[p.slot]), "cudaEventSynchronize");
        in_flight.pop_front();
        sink(std::span<const uint8_t>(ring_ + uint64_t{p.slot} * slot_bytes_, p.bytes));
      }
    } catch (...) {
      (void)cuda_.StreamSynchronize(d.stream);  // no copy may still write the ring
      throw;
    }
  }

 private:
  struct PerDevice {
    CudaStream stream = nullptr;
    CudaEvent ready = nullptr;
    std::vector<CudaEvent> events;  // one per slot
  };

  PerDevice& Device(int device) {
    auto it = devices_.find(device);
    if (it != devices_.end()) return it->second;
    PerDevice& d = devices_[device];  // destroyed with the reader even if a call below fails
    CudaCheck(cuda_, cuda_.StreamCreateWithFlags(&d.stream, kCudaStreamNonBlocking), "cudaStreamCreate");
    CudaCheck(cuda_, cuda_.EventCreateWithFlags(&d.ready, kCudaEventDisableTiming), "cudaEventCreate");
    for (unsigned s = 0; s < slots_; ++s) {
      CudaEvent e = nullptr;
      CudaCheck(cuda_, cuda_.EventCreateWithFlags(&e, kCudaEventDisableTiming), "cudaEventCreate");
      d.events.push_back(e);
    }
    return d;
  }

  // The kept ring when it is free and large enough, else a new one (kept unless another save
  // holds the kept one).
  void TakeRing() {
    const uint64_t need = uint64_t{slots_} * slot_bytes_;
    KeptRing& k = Kept();
    std::lock_guard<std::mutex> lock(k.mutex);
    if (!k.in_use && k.bytes >= need) {
      ring_ = k.data;
      k.in_use = kept_ = true;
      return;
    }
    void* p = nullptr;
    CudaCheck(cuda_, cuda_.HostAlloc(&p, need, kCudaHostAllocPortable),
              "cudaHostAlloc of a " + std::to_string(need) + "-byte pinned save ring");
    ring_ = static_cast<uint8_t*>(p);
    if (!k.in_use) {
      if (k.data != nullptr) (void)cuda_.FreeHost(k.data);
      k.data = ring_;
      k.bytes = need;
      k.in_use = kept_ = true;
    }
  }

  void ReleaseRing() noexcept {
    if (ring_ == nullptr) return;
    if (!kept_) {
      (void)cuda_.FreeHost(ring_);
    } else {
      KeptRing& k = Kept();
      std::lock_guard<std::mutex> lock(k.mutex);
      k.in_use = false;
    }
    ring_ = nullptr;
  }

  const CudaRuntime& cuda_;
  const unsigned slots_;
  const uint64_t slot_bytes_;
  const StreamToWaitFor wait_for_;
  uint8_t* ring_ = nullptr;
  bool kept_ = false;
  std::map<int, PerDevice> devices_;
};

}  // namespace

std::unique_ptr<DeviceReader> MakeCudaReader(unsigned slots, uint64_t slot_bytes, StreamToWaitFor wait_for) {
  try {
    (void)Cuda();
  } catch (const Error& e) {
    throw Error(e.kind(), std::string("a storage is on a CUDA device: ") + e.what());
  }
  return std::make_unique<CudaReader>(slots, slot_bytes, std::move(wait_for));
}

}  // namespace zckpt::save
