// The CUDA copy engine: cudaMemcpyAsync from pinned ring slots on a stream of our own per device,
// one event per slot and device; a slot goes back to the readers once its events have fired, so
// reading the next slots overlaps the DMA of the previous ones.
#include "loader/copy_engine.h"

#include <string>

#include "zckpt/error.h"

#if ZCKPT_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <deque>
#endif

namespace zckpt::loader {

#if ZCKPT_WITH_CUDA

namespace {

void CudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a sticky-free error so later calls are not blamed
  throw Error(ErrorKind::kIo, std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// Makes `device` current for a scope (CUDA streams and events belong to a device).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    CudaCheck(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) CudaCheck(cudaSetDevice(device), "cudaSetDevice");
    changed_ = previous_ != device;
  }
  ~DeviceScope() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(const std::vector<int>& devices, unsigned slots) : touched_(slots, 0) {
    if (devices.size() > 64) throw Error(ErrorKind::kInvalidArgument, "more than 64 CUDA devices in one load");
    try {
      for (int device : devices) AddDevice(device, slots);
    } catch (...) {
      Destroy();
      throw;
    }
  }
  ~CudaCopyEngine() override { Destroy(); }

  uint8_t* AllocateHost(uint64_t bytes) override {
    // Pinned, portable (usable from every device's context); allocated with the first
    // destination device current so no context is created on a device the load does not use.
    DeviceScope scope(devices_.empty() ? 0 : devices_[0].device);
    void* p = nullptr;
    CudaCheck(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc (pinned ring slot)");
    return static_cast<uint8_t*>(p);
  }
  void FreeHost(uint8_t* p) noexcept override { (void)cudaFreeHost(p); }

  void CopyToDevice(const uint8_t* src, uint8_t* dst, uint64_t bytes, int device) override {
    size_t k = IndexOf(device);
    DeviceScope scope(device);
    CudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, devices_[k].stream), "cudaMemcpyAsync");
    current_ |= uint64_t{1} << k;
  }

  void EndSlot(unsigned slot) override {
    for (size_t k = 0; k < devices_.size(); ++k) {
      if (!(current_ >> k & 1)) continue;
      DeviceScope scope(devices_[k].device);
      CudaCheck(cudaEventRecord(devices_[k].events[slot], devices_[k].stream), "cudaEventRecord");
    }
    touched_[slot] = current_;
    current_ = 0;
    in_flight_.push_back(slot);
  }

  void Reclaim(bool wait, std::vector<unsigned>* done) override {
    size_t before = done->size();
    while (!in_flight_.empty()) {
      unsigned slot = in_flight_.front();
      // Copies on one stream complete in order, so the oldest slot is the one to wait for.
      bool must_wait = wait && done->size() == before;
      if (!SlotDone(slot, must_wait)) break;
      in_flight_.pop_front();
      done->push_back(slot);
    }
  }

  bool HasInFlight() const override { return !in_flight_.empty(); }

  void Synchronize() override {
    for (const auto& d : devices_) {
      DeviceScope scope(d.device);
      CudaCheck(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize");
    }
  }

 private:
  struct PerDevice {
    int device = 0;
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> events;  // one per slot
  };

  void AddDevice(int device, unsigned slots) {
    DeviceScope scope(device);
    PerDevice& d = devices_.emplace_back();
    d.device = device;
    CudaCheck(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (unsigned s = 0; s < slots; ++s) {
      cudaEvent_t e = nullptr;
      CudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      d.events.push_back(e);
    }
    // Our stream starts after everything already queued on torch's current stream: the caching
    // allocator hands out blocks ordered on that stream, and a LoadInto target may still be
    // being produced there.
    cudaEvent_t ready = nullptr;
    CudaCheck(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    cudaStream_t current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    cudaError_t e = cudaEventRecord(ready, current);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(d.stream, ready, 0);
    (void)cudaEventDestroy(ready);
    CudaCheck(e, "cudaStreamWaitEvent (torch's current stream)");
  }

  size_t IndexOf(int device) const {
    for (size_t k = 0; k < devices_.size(); ++k)
      if (devices_[k].device == device) return k;
    throw Error(ErrorKind::kInvalidArgument, "CUDA device " + std::to_string(device) + " was not prepared for this load");
  }

  bool SlotDone(unsigned slot, bool wait) {
    for (size_t k = 0; k < devices_.size(); ++k) {
      if (!(touched_[slot] >> k & 1)) continue;
      cudaEvent_t e = devices_[k].events[slot];
      if (wait) {
        CudaCheck(cudaEventSynchronize(e), "cudaEventSynchronize");
        continue;
      }
      cudaError_t q = cudaEventQuery(e);
      if (q == cudaErrorNotReady) return false;
      CudaCheck(q, "cudaEventQuery");
    }
    return true;
  }

  void Destroy() noexcept {
    int previous = 0;
    (void)cudaGetDevice(&previous);
    for (auto& d : devices_) {
      (void)cudaSetDevice(d.device);
      if (d.stream != nullptr) (void)cudaStreamSynchronize(d.stream);
      for (cudaEvent_t e : d.events) (void)cudaEventDestroy(e);
      if (d.stream != nullptr) (void)cudaStreamDestroy(d.stream);
    }
    (void)cudaSetDevice(previous);
    devices_.clear();
  }

  std::vector<PerDevice> devices_;
  std::vector<uint64_t> touched_;  // per slot: bit k set when device k copied from it
  uint64_t current_ = 0;           // devices touched by the slot being delivered
  std::deque<unsigned> in_flight_;
};

}  // namespace

std::unique_ptr<CopyEngine> MakeCudaCopyEngine(const std::vector<int>& devices, unsigned slots) {
  return std::make_unique<CudaCopyEngine>(devices, slots);
}

#else

std::unique_ptr<CopyEngine> MakeCudaCopyEngine(const std::vector<int>&, unsigned) {
  throw Error(ErrorKind::kUnsupported, "zckpt was built without CUDA: cannot load to a CUDA device");
}

#endif

}  // namespace zckpt::loader
