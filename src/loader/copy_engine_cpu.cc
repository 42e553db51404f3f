// The CPU copy engine: host destinations are memcpy'd by the pipeline as slots are delivered,
// so a slot is free again as soon as its delivery returns.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "loader/copy_engine.h"
#include "loader/plan.h"
#include "zckpt/error.h"

namespace zckpt::loader {

uint8_t* AllocateAlignedHost(uint64_t bytes) {
  // Block alignment (kDirectIoAlign): the O_DIRECT method reads into slots.
  void* p = nullptr;
  if (posix_memalign(&p, kDirectIoAlign, bytes) != 0)
    throw Error(ErrorKind::kOutOfMemory, "cannot allocate a " + std::to_string(bytes) + "-byte ring slot");
  return static_cast<uint8_t*>(p);
}

void FreeAlignedHost(uint8_t* p) noexcept { std::free(p); }

namespace {

class CpuCopyEngine final : public CopyEngine {
 public:
  uint8_t* AllocateHost(uint64_t bytes) override { return AllocateAlignedHost(bytes); }
  void FreeHost(uint8_t* p) noexcept override { FreeAlignedHost(p); }

  void CopyToDevice(const uint8_t*, uint8_t*, uint64_t, int) override {
    throw Error(ErrorKind::kInvalidArgument, "the CPU copy engine got a device destination");
  }
  void EndSlot(unsigned slot) override { ended_.push_back(slot); }
  void Reclaim(bool, std::vector<unsigned>* done) override {
    done->insert(done->end(), ended_.begin(), ended_.end());
    ended_.clear();
  }
  bool HasInFlight() const override { return !ended_.empty(); }
  void Synchronize() override {}

 private:
  std::vector<unsigned> ended_;
};

}  // namespace

std::unique_ptr<CopyEngine> MakeCpuCopyEngine() { return std::make_unique<CpuCopyEngine>(); }

}  // namespace zckpt::loader
