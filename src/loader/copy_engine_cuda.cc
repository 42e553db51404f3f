// The CUDA copy engine: cudaMemcpyAsync from pinned ring slots on a stream of our own per device,
// one event per slot and device; a slot goes back to the readers once its events have fired, so
// reading the next slots overlaps the DMA of the previous ones. On devices that read pageable
// memory through the host's page tables the slots are plain memory, and raw chunks are copied
// from the file's mapping instead (ReadsPageableHost; docs/unified-memory.md).
//
// Torch-free, and built without CUDA headers: the runtime is loaded when the first engine is made
// (cudart_loader.h), so every build has this engine. The torch-facing layer hands it the streams
// to wait for and holds torch's device guard around it (torch_cuda.cc); the Python module's
// `_core` hands it torch's current streams from Python; tests/cudasim runs it against a simulated
// asynchronous runtime loaded the same way.
#include "loader/copy_engine.h"

#include <deque>
#include <string>

#include "common/cuda_check.h"
#include "loader/pinned_cache.h"
#include "zckpt/error.h"

// Deliberately broken variants, compiled only into the simulator suite by tools/ci/sim-mutants.sh
// (meson -Dsim_mutant=N, which no other target sees), to show that the suite catches each:
//   1  a slot goes back to the readers as soon as its copies are issued, not completed
//   2  the engine's streams do not wait for the caller's stream
//   3  waiting for the engine's streams (Synchronize, and before destroying them) does nothing
#ifndef ZCKPT_SIM_MUTANT
#define ZCKPT_SIM_MUTANT 0
#endif

namespace zckpt::loader {

namespace {

constexpr int kMutant = ZCKPT_SIM_MUTANT;

class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(const std::vector<CudaDevice>& devices, unsigned slots) : cuda_(Cuda()), touched_(slots, 0) {
    if (devices.size() > 64) throw Error(ErrorKind::kInvalidArgument, "more than 64 CUDA devices in one load");
    try {
      for (const CudaDevice& device : devices) AddDevice(device, slots);
      reads_pageable_ = !devices_.empty();
      for (const PerDevice& d : devices_) reads_pageable_ = reads_pageable_ && ReadsPageable(d.device);
    } catch (...) {
      Destroy();
      throw;
    }
  }
  ~CudaCopyEngine() override { Destroy(); }

  uint8_t* AllocateHost(uint64_t bytes) override {
    // A device that reads pageable memory needs no page-locked slots: plain memory, never the
    // pinned cache (page-locking synchronizes the device and pins memory the load does not need).
    if (reads_pageable_) return AllocateAlignedHost(bytes);
    // Made with the first destination device current, so no context is created on a device the
    // load does not use (pinned memory is portable: every device's copies may read it).
    if (!devices_.empty()) UseDevice(cuda_, devices_[0].device);
    return PinnedCache::Global().Take(bytes);
  }
  void FreeHost(uint8_t* p) noexcept override {
    if (reads_pageable_) return FreeAlignedHost(p);
    PinnedCache::Global().Give(p);
  }
  bool ReadsPageableHost() const override { return reads_pageable_; }

  void CopyToDevice(const uint8_t* src, uint8_t* dst, uint64_t bytes, int device) override {
    size_t k = IndexOf(device);
    UseDevice(cuda_, device);
    CudaCheck(cuda_, cuda_.MemcpyAsync(dst, src, bytes, kCudaMemcpyHostToDevice, devices_[k].stream), "cudaMemcpyAsync");
    current_ |= uint64_t{1} << k;
  }

  void EndSlot(unsigned slot) override {
    for (size_t k = 0; k < devices_.size(); ++k) {
      if (!(current_ >> k & 1)) continue;
      UseDevice(cuda_, devices_[k].device);
      CudaCheck(cuda_, cuda_.EventRecord(devices_[k].events[slot], devices_[k].stream), "cudaEventRecord");
    }
    touched_[slot] = kMutant == 1 ? 0 : current_;  // mutant 1: as if no copy read the slot
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
    for (const auto& d : devices_) CudaCheck(cuda_, WaitForStream(d), "cudaStreamSynchronize");
  }

 private:
  struct PerDevice {
    int device = 0;
    CudaStream stream = nullptr;
    std::vector<CudaEvent> events;  // one per slot
  };

  CudaStatus WaitForStream(const PerDevice& d) {
    if (kMutant == 3) return kCudaSuccess;
    return cuda_.StreamSynchronize(d.stream);
  }

  void AddDevice(const CudaDevice& target, unsigned slots) {
    UseDevice(cuda_, target.index);
    PerDevice& d = devices_.emplace_back();
    d.device = target.index;
    CudaCheck(cuda_, cuda_.StreamCreateWithFlags(&d.stream, kCudaStreamNonBlocking), "cudaStreamCreate");
    for (unsigned s = 0; s < slots; ++s) {
      CudaEvent e = nullptr;
      CudaCheck(cuda_, cuda_.EventCreateWithFlags(&e, kCudaEventDisableTiming), "cudaEventCreate");
      d.events.push_back(e);
    }
    if (kMutant == 2) return;
    // Our stream starts after everything already queued on the caller's stream (an event of this
    // device, recorded there with this device current: the legacy default stream is the current
    // device's).
    CudaEvent ready = nullptr;
    CudaCheck(cuda_, cuda_.EventCreateWithFlags(&ready, kCudaEventDisableTiming), "cudaEventCreate");
    CudaStatus e = cuda_.EventRecord(ready, target.wait_for);
    if (e == kCudaSuccess) e = cuda_.StreamWaitEvent(d.stream, ready, 0);
    (void)cuda_.EventDestroy(ready);
    CudaCheck(cuda_, e, "cudaStreamWaitEvent (the caller's stream)");
  }

  // Both attributes: pageable memory is accessed coherently (88), and through the host's page
  // tables (100: ATS, so a copy from it is the device's own read, with no driver staging; HMM
  // over PCIe says 88 alone, and its copies from pageable memory are staged by the driver).
  bool ReadsPageable(int device) const {
    for (int attribute : {kCudaDevAttrPageableMemoryAccess, kCudaDevAttrPageableMemoryAccessUsesHostPageTables}) {
      int value = 0;
      if (cuda_.DeviceGetAttribute(&value, attribute, device) != kCudaSuccess) {
        (void)cuda_.GetLastError();  // an attribute this runtime does not know: not such a device
        return false;
      }
      if (value != 1) return false;
    }
    return true;
  }

  size_t IndexOf(int device) const {
    for (size_t k = 0; k < devices_.size(); ++k)
      if (devices_[k].device == device) return k;
    throw Error(ErrorKind::kInvalidArgument, "CUDA device " + std::to_string(device) + " was not prepared for this load");
  }

  bool SlotDone(unsigned slot, bool wait) {
    for (size_t k = 0; k < devices_.size(); ++k) {
      if (!(touched_[slot] >> k & 1)) continue;
      CudaEvent e = devices_[k].events[slot];
      if (wait) {
        CudaCheck(cuda_, cuda_.EventSynchronize(e), "cudaEventSynchronize");
        continue;
      }
      CudaStatus q = cuda_.EventQuery(e);
      if (q == kCudaErrorNotReady) return false;
      CudaCheck(cuda_, q, "cudaEventQuery");
    }
    return true;
  }

  void Destroy() noexcept {
    for (auto& d : devices_) {
      try {
        UseDevice(cuda_, d.device);  // a device of this load: it has its context already
      } catch (const Error&) {
      }
      if (d.stream != nullptr) (void)WaitForStream(d);
      for (CudaEvent e : d.events) (void)cuda_.EventDestroy(e);
      if (d.stream != nullptr) (void)cuda_.StreamDestroy(d.stream);
    }
    devices_.clear();
  }

  const CudaRuntime& cuda_;
  std::vector<PerDevice> devices_;
  std::vector<uint64_t> touched_;  // per slot: bit k set when device k copied from it
  uint64_t current_ = 0;           // devices touched by the slot being delivered
  bool reads_pageable_ = false;    // every device reads pageable host memory (ReadsPageableHost)
  std::deque<unsigned> in_flight_;
};

}  // namespace

std::unique_ptr<CopyEngine> MakeCudaCopyEngine(const std::vector<CudaDevice>& devices, unsigned slots) {
  try {
    (void)Cuda();
  } catch (const Error& e) {
    throw Error(e.kind(), "cannot load to cuda:" + std::to_string(devices.empty() ? 0 : devices[0].index) + ": " + e.what());
  }
  return std::make_unique<CudaCopyEngine>(devices, slots);
}


}  // namespace zckpt::loader
