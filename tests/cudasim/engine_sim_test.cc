// The CUDA copy engine (src/loader/copy_engine_cuda.cc), with the real pipeline, plan, ring and
// chunk readers, run against the simulated asynchronous CUDA runtime (cudasim.h): no GPU, no
// torch. Destinations are simulated device memory on 1 or 2 devices (and host memory beside
// them); every load's bytes are read back and compared with Container::ReadChunk's, and any
// misuse the simulator caught (a slot refilled under its copy, a destination freed under a copy,
// an event on another device's stream) fails the test that caused it.
//
// tools/ci/sim-mutants.sh builds this suite against three deliberately broken engines and shows
// that each fails it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "cudasim.h"
#include "hardening_util.h"
#include "loader/copy_engine.h"
#include "common/cudart_loader.h"
#include "loader/pinned_cache.h"
#include "loader/plan.h"
#include "loader/stream.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/load_options.h"

namespace zckpt {
namespace {

using loader::CudaDevice;
using loader::Destinations;
using loader::PinnedCache;
using loader::Piece;
using testing::TempDir;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

cudasim::Config SimConfig(int devices) {
  cudasim::Config c;
  c.devices = devices;
  c.device_bytes = 256ull << 20;
  c.max_delay_us = 200;
  c.seed = 7;
  return c;
}

// Where each storage of a container goes: simulated device memory on some device, or host memory.
class Target {
 public:
  // `devices`: 1 or 2, numbered from `first_device`. With `mixed`, every third storage stays on
  // the host. With `split`, chunks of device storages are split in two pieces, the second half
  // going to the other device's copy.
  Target(const Container& c, int devices, bool mixed, bool split, int first_device = 0)
      : c_(c), first_device_(first_device) {
    const uint64_t chunk_bytes = c.superblock().chunk_bytes;
    d_ = std::make_unique<Destinations>(c.chunk_count());
    for (uint32_t s = 0; s < c.storage_count(); ++s) {
      StorageInfo si = c.storage(s);
      Storage st;
      st.device = mixed && s % 3 == 2 ? -1 : first_device + static_cast<int>(s % static_cast<uint32_t>(devices));
      st.expected.assign(si.raw_bytes, 0);
      for (uint64_t k = 0; k < si.chunk_count; ++k)
        c.ReadChunk(si.first_chunk + k, st.expected.data() + k * chunk_bytes, true);
      if (st.device < 0) {
        st.host.assign(si.raw_bytes, 0xEE);
        st.base = st.host.data();
      } else {
        st.base = DeviceAlloc(st.device, si.raw_bytes);
        if (split && devices == 2) st.other = DeviceAlloc(1 - st.device, si.raw_bytes);
      }
      for (uint64_t k = 0; k < si.chunk_count; ++k) {
        uint64_t i = si.first_chunk + k;
        uint64_t raw = c.chunk(i).raw_bytes;
        uint64_t at = k * chunk_bytes;
        if (st.other != nullptr && raw > 1) {
          uint64_t half = raw / 2;
          d_->Add(i, Piece{0, half, st.base + at, st.device, -1, 0});
          d_->Add(i, Piece{half, raw - half, st.other + at + half, 1 - st.device, -1, 0});
        } else {
          d_->Add(i, Piece{0, raw, st.base + at, st.device, -1, 0});
        }
      }
      storages_.push_back(std::move(st));
    }
    d_->Finish();
  }
  ~Target() {
    for (auto& st : storages_) {
      if (st.device >= 0) (void)cudaFree(st.base);
      if (st.other != nullptr) (void)cudaFree(st.other);
    }
  }
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  const Destinations& destinations() const { return *d_; }
  std::vector<CudaDevice> devices(int count, cudaStream_t wait_for = nullptr) const {
    std::vector<CudaDevice> out;
    for (int i = 0; i < count; ++i) out.push_back(CudaDevice{first_device_ + i, wait_for});
    return out;
  }
  std::vector<uint8_t*> device_buffers(int device) const {
    std::vector<uint8_t*> out;
    for (const auto& st : storages_) {
      if (st.device == device) out.push_back(st.base);
      if (st.other != nullptr && 1 - st.device == device) out.push_back(st.other);
    }
    return out;
  }
  uint64_t bytes_of(uint8_t* buffer) const {
    for (uint32_t s = 0; s < storages_.size(); ++s)
      if (storages_[s].base == buffer || storages_[s].other == buffer) return c_.storage(s).raw_bytes;
    return 0;
  }

  // Reads every destination back (device memory with a synchronous cudaMemcpy, which waits for
  // nothing on the engine's non-blocking streams) and compares; "" when all match.
  std::string Check() const {
    const uint64_t chunk_bytes = c_.superblock().chunk_bytes;
    for (uint32_t s = 0; s < storages_.size(); ++s) {
      const Storage& st = storages_[s];
      std::vector<uint8_t> got = st.host;
      if (st.device >= 0) {
        got.assign(st.expected.size(), 0);
        if (!got.empty() && cudaMemcpy(got.data(), st.base, got.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
          return "cudaMemcpy failed";
        if (st.other != nullptr) {
          std::vector<uint8_t> second(got.size());
          if (!second.empty() && cudaMemcpy(second.data(), st.other, second.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
            return "cudaMemcpy failed";
          StorageInfo si = c_.storage(s);
          for (uint64_t k = 0; k < si.chunk_count; ++k) {  // second halves live in the other copy
            uint64_t raw = c_.chunk(si.first_chunk + k).raw_bytes;
            if (raw <= 1) continue;
            uint64_t at = k * chunk_bytes + raw / 2;
            std::memcpy(got.data() + at, second.data() + at, raw - raw / 2);
          }
        }
      }
      if (got != st.expected) {
        uint64_t first = 0;
        while (first < got.size() && got[first] == st.expected[first]) ++first;
        return "storage " + std::to_string(s) + " (device " + std::to_string(st.device) + ", " +
               std::to_string(got.size()) + " bytes) differs from byte " + std::to_string(first);
      }
    }
    return "";
  }

 private:
  struct Storage {
    int device = -1;
    uint8_t* base = nullptr;
    uint8_t* other = nullptr;  // split: the other device's copy
    std::vector<uint8_t> host;
    std::vector<uint8_t> expected;
  };
  static uint8_t* DeviceAlloc(int device, uint64_t bytes) {
    void* p = nullptr;
    if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess)
      throw std::runtime_error("cudaMalloc failed");
    return static_cast<uint8_t*>(p);
  }

  const Container& c_;
  int first_device_;
  std::unique_ptr<Destinations> d_;
  std::vector<Storage> storages_;
};

struct Sample {
  TempDir dir;
  std::string path;
  Sample(uint64_t chunk_bytes, int zstd, uint64_t seed = 3) : path(dir.File("sim.zckpt")) {
    hardening::WriteSampleContainer(path, seed, 10, 256 << 10, zstd, chunk_bytes);
  }
};

class Sim : public ::testing::Test {
 protected:
  void SetUp() override { Restart(2); }
  void TearDown() override {
    PinnedCache::Global().Trim(0);
    for (const std::string& v : cudasim::TakeViolations()) ADD_FAILURE() << "cudasim: " << v;
    cudasim::Counters c = cudasim::Read();
    for (size_t d = 0; d < c.devices.size(); ++d) {
      EXPECT_EQ(c.devices[d].streams_alive, 0u) << "device " << d << ": streams left behind";
      EXPECT_EQ(c.devices[d].events_alive, 0u) << "device " << d << ": events left behind";
    }
    EXPECT_EQ(PinnedCache::Global().stats().in_use_bytes, 0u) << "ring slots never given back";
    EXPECT_TRUE(cudasim::Reset(SimConfig(2))) << "streams, events or allocations left behind";  // joins the stream threads
  }
  // A fresh runtime with `devices` devices; the pinned cache emptied and at its default limit.
  void Restart(int devices, cudasim::Config config = SimConfig(2)) {
    PinnedCache::Global().Trim(0);
    PinnedCache::Global().set_limit(PinnedCache::kDefaultLimit);
    config.devices = devices;
    ASSERT_TRUE(cudasim::Reset(config));
    (void)cudasim::TakeViolations();
  }
};

std::string Describe(int devices, unsigned readers, unsigned slots, ReadMethod m, uint64_t chunk, uint64_t slot) {
  return std::to_string(devices) + " device(s), " + std::to_string(readers) + " readers, " + std::to_string(slots) +
         " slots, " + ReadMethodName(m) + ", chunks of " + std::to_string(chunk) + " B, slot_bytes " + std::to_string(slot);
}

// --- the simulator catches what it must (so the suite below can fail) -------------------------

void SleepMs(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); }

TEST_F(Sim, SimulatorCatchesASourceRewrittenBeforeItsCopyRan) {
  void *pinned = nullptr, *dev = nullptr;
  CUDA_OK(cudaHostAlloc(&pinned, 4096, cudaHostAllocPortable));
  CUDA_OK(cudaMalloc(&dev, 4096));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int ms = 30;
  CUDA_OK(cudaLaunchHostFunc(s, SleepMs, &ms));
  CUDA_OK(cudaMemcpyAsync(dev, pinned, 4096, cudaMemcpyHostToDevice, s));
  std::memset(pinned, 1, 4096);  // the copy has not run yet
  CUDA_OK(cudaStreamSynchronize(s));
  std::vector<std::string> v = cudasim::TakeViolations();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("rewritten between enqueue and execution"), std::string::npos) << v[0];
  // From pageable memory: refused (the ring must be pinned).
  std::vector<uint8_t> pageable(16);
  EXPECT_EQ(cudaMemcpyAsync(dev, pageable.data(), 16, cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
  EXPECT_EQ(cudasim::TakeViolations().size(), 1u);
  (void)cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(dev));
  CUDA_OK(cudaFreeHost(pinned));
}

TEST_F(Sim, SimulatorRefusesAnEventRecordedOnAnotherDevicesStream) {
  CUDA_OK(cudaSetDevice(0));
  cudaEvent_t e;
  CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_OK(cudaSetDevice(1));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  EXPECT_EQ(cudaEventRecord(e, s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventRecord(e, nullptr), cudaErrorInvalidResourceHandle);  // legacy stream of device 1
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudasim::TakeViolations().size(), 2u);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaEventRecord(e, nullptr));
  CUDA_OK(cudaStreamWaitEvent(s, e, 0));  // waiting on another device's event is allowed
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaStreamDestroy(s));
}

struct Flag {
  int ms = 0;
  std::atomic<bool> set{false};
};
void SleepThenSet(void* p) {
  auto* f = static_cast<Flag*>(p);
  std::this_thread::sleep_for(std::chrono::milliseconds(f->ms));
  f->set = true;
}

TEST_F(Sim, SimulatorSerializesTheLegacyStreamAndSynchronizesPinnedAllocation) {
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, 64));
  uint8_t back[64];
  cudaStream_t blocking, nonblocking;
  CUDA_OK(cudaStreamCreate(&blocking));
  CUDA_OK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
  Flag a{30}, b{300};
  CUDA_OK(cudaLaunchHostFunc(blocking, SleepThenSet, &a));
  CUDA_OK(cudaLaunchHostFunc(nonblocking, SleepThenSet, &b));
  CUDA_OK(cudaMemcpy(back, dev, 64, cudaMemcpyDeviceToHost));  // legacy stream
  EXPECT_TRUE(a.set) << "the legacy stream did not wait for a blocking stream";
  EXPECT_FALSE(b.set) << "the legacy stream waited for a non-blocking stream";
  uint64_t syncs = cudasim::Read().implicit_syncs;
  void* pinned = nullptr;
  CUDA_OK(cudaHostAlloc(&pinned, 64, 0));
  EXPECT_TRUE(b.set) << "cudaHostAlloc did not synchronize the device";
  CUDA_OK(cudaFreeHost(pinned));
  EXPECT_EQ(cudasim::Read().implicit_syncs, syncs + 2);
  CUDA_OK(cudaStreamDestroy(blocking));
  CUDA_OK(cudaStreamDestroy(nonblocking));
  CUDA_OK(cudaFree(dev));
}

TEST_F(Sim, SimulatorCreatesContextsOnSetDeviceOnly) {
  int d = -1;
  CUDA_OK(cudaGetDevice(&d));
  EXPECT_EQ(d, 0);
  EXPECT_FALSE(cudasim::Read().devices[0].context) << "cudaGetDevice created a context";
  CUDA_OK(cudaSetDevice(1));
  cudasim::Counters c = cudasim::Read();
  EXPECT_FALSE(c.devices[0].context);
  EXPECT_TRUE(c.devices[1].context);
  CUDA_OK(cudaSetDevice(0));  // what restoring the previous device with cudaSetDevice costs
  EXPECT_EQ(cudasim::Read().devices[0].contexts_created, 1u);
  size_t free = 0, total = 0;
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 300ull << 20), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CUDA_OK(cudaMalloc(&p, 3 << 20));
  CUDA_OK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(total - free, 4u << 20);  // whole 2 MiB pages
  CUDA_OK(cudaFree(p));
}

// --- the engine -------------------------------------------------------------------------------

// The engine reaches the simulator the way it reaches libcudart: loaded at run time, through the
// table (meson's test environment sets ZCKPT_CUDART to the simulator's file).
TEST(Runtime, TheEngineLoadsTheSimulatorAsItsCudaRuntime) {
  const CudaRuntime& rt = Cuda();
  EXPECT_NE(rt.path.find("libzckpt_cudasim"), std::string::npos) << rt.path;
  int n = 0;
  EXPECT_EQ(rt.GetDeviceCount(&n), 0);
  EXPECT_EQ(rt.MemcpyAsync, reinterpret_cast<decltype(rt.MemcpyAsync)>(&cudaMemcpyAsync));
}

TEST(Runtime, NoRuntimeNamesEveryLibraryAndFolderSearched) {
  try {
    LoadCudaRuntime("", {"libcudart-missing.so.99", "libcudart-missing.so.98"}, {"/nonexistent/cuda/lib64"});
    FAIL() << "a runtime was loaded";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(m.find("libcudart-missing.so.99, libcudart-missing.so.98"), std::string::npos) << m;
    EXPECT_NE(m.find("already in this process"), std::string::npos) << m;
    EXPECT_NE(m.find("/nonexistent/cuda/lib64"), std::string::npos) << m;
    EXPECT_NE(m.find("ZCKPT_CUDART"), std::string::npos) << m;
  }
  try {
    LoadCudaRuntime("/nonexistent/libcudart.so.12", kCudaRuntimeNames, kCudaLibraryDirs);
    FAIL() << "a runtime was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZCKPT_CUDART=/nonexistent/libcudart.so.12 does not load"), std::string::npos)
        << e.what();
  }
}

TEST(Runtime, ALibraryWithoutTheCallsIsRefusedNamingTheCall) {
  // libzstd is loaded (the readers link it) and has none of the runtime's functions.
  try {
    LoadCudaRuntime("", {"libzstd.so.1"}, {});
    FAIL() << "libzstd taken for a CUDA runtime";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no cudaGetDevice"), std::string::npos) << e.what();
  }
}

TEST_F(Sim, LoadsEveryConfiguration) {
  struct Layout {
    uint64_t chunk_bytes, slot_bytes;
    int zstd;
  };
  // Many chunks per slot; chunks larger than the slot asked for (the slot grows to one chunk);
  // zstd and raw chunks mixed.
  const Layout layouts[] = {{4096, 64 << 10, 3}, {256 << 10, 64 << 10, 0}, {64 << 10, 64 << 10, 5}};
  for (const Layout& layout : layouts) {
    Sample sample(layout.chunk_bytes, layout.zstd);
    auto c = Container::Open(sample.path);
    for (int devices : {1, 2}) {
      Restart(devices);
      for (unsigned readers : {1u, 3u, 8u}) {
        for (unsigned slots : {1u, 2u, 8u}) {
          for (ReadMethod method : {ReadMethod::kPread, ReadMethod::kMmap}) {
            bool mixed = (readers + slots) % 2 == 0;
            bool split = devices == 2 && readers == 3;
            SCOPED_TRACE(Describe(devices, readers, slots, method, layout.chunk_bytes, layout.slot_bytes) +
                         (mixed ? ", host storages too" : "") + (split ? ", chunks split across devices" : ""));
            Target target(*c, devices, mixed, split);
            LoadOptions o;
            o.threads = readers;
            o.slots = slots;
            o.method = method;
            o.slot_bytes = layout.slot_bytes;
            LoadStats st = loader::StreamChunks(*c, target.destinations(), o, target.devices(devices));
            EXPECT_GT(st.ring_bytes, 0u);
            EXPECT_EQ(target.Check(), "");
            for (const std::string& v : cudasim::TakeViolations()) ADD_FAILURE() << "cudasim: " << v;
          }
        }
      }
    }
  }
}

// A LoadInto target still being written on the caller's stream (or memory the caching allocator
// just handed out, last written there): the engine's copies must land after that work.
TEST_F(Sim, CopiesWaitForTheCallersStream) {
  Sample sample(4096, 0);
  auto c = Container::Open(sample.path);
  for (bool legacy : {true, false}) {
    SCOPED_TRACE(legacy ? "caller's stream: the legacy default stream" : "caller's stream: a stream of its own");
    Target target(*c, 2, false, false);
    std::vector<cudaStream_t> callers(2, nullptr);
    int ms = 20;
    for (int dev = 0; dev < 2; ++dev) {
      CUDA_OK(cudaSetDevice(dev));
      if (!legacy) {
        CUDA_OK(cudaStreamCreateWithFlags(&callers[static_cast<size_t>(dev)], cudaStreamNonBlocking));
      }
      cudaStream_t s = callers[static_cast<size_t>(dev)];
      // The producer: slow, then it writes every destination of this device.
      CUDA_OK(cudaLaunchHostFunc(s, SleepMs, &ms));
      for (uint8_t* p : target.device_buffers(dev)) CUDA_OK(cudaMemsetAsync(p, 0x5A, target.bytes_of(p), s));
    }
    std::vector<CudaDevice> devices = {{0, callers[0]}, {1, callers[1]}};
    LoadOptions o;
    o.threads = 3;
    o.slots = 4;
    o.slot_bytes = 64 << 10;
    loader::StreamChunks(*c, target.destinations(), o, devices);
    EXPECT_EQ(target.Check(), "");
    for (cudaStream_t s : callers) {
      if (s != nullptr) {
        CUDA_OK(cudaStreamDestroy(s));
      }
    }
  }
}

// What LoadRegions (a DCP reader's boxes, src/loader/load_regions.cc) hands the engine: byte
// ranges of storages starting and ending mid-chunk, several targets sharing a chunk, chunks no
// region needs, and staged ranges (non-contiguous boxes) whose completion copies the host buffer
// to the device synchronously (as copy_() does) while the engine's copies from the same slots
// are still in flight.
TEST_F(Sim, RegionsStartingAndEndingMidChunkWithStagedBoxes) {
  struct Region {
    uint32_t storage = 0;
    uint64_t lo = 0, hi = 0;  // bytes of the storage
    int device = -1;  // -1: host
    bool staged = false;
    uint8_t* dev = nullptr;
    std::vector<uint8_t> host, expected, staging;
    int completions = 0;
  };
  uint64_t seen_mid_chunk = 0, seen_staged_device = 0, seen_direct_device = 0, seen_host = 0;
  for (uint64_t chunk_bytes : {uint64_t{4096}, uint64_t{64} << 10}) {
    Sample sample(chunk_bytes, chunk_bytes == 4096 ? 3 : 0, 11);
    auto c = Container::Open(sample.path);
    for (int devices : {1, 2}) {
      Restart(devices);
      std::mt19937_64 rng(chunk_bytes + static_cast<uint64_t>(devices));
      for (unsigned readers : {1u, 4u}) {
        for (unsigned slots : {1u, 3u}) {
          for (ReadMethod method : {ReadMethod::kPread, ReadMethod::kMmap}) {
            SCOPED_TRACE(Describe(devices, readers, slots, method, chunk_bytes, 32 << 10));
            std::vector<Region> regions;
            for (uint32_t si = 0; si < c->storage_count(); ++si) {
              StorageInfo info = c->storage(si);
              std::vector<uint8_t> bytes(info.raw_bytes);
              for (uint64_t k = 0; k < info.chunk_count; ++k)
                c->ReadChunk(info.first_chunk + k, bytes.data() + k * chunk_bytes, true);
              // Up to four regions with gaps between them, at random byte boundaries.
              uint64_t at = 0;
              for (int n = 0; n < 4 && at < info.raw_bytes; ++n) {
                Region r;
                r.storage = si;
                r.lo = at + rng() % std::max<uint64_t>(1, (info.raw_bytes - at) / 4);
                r.hi = std::min(info.raw_bytes, r.lo + 1 + rng() % std::max<uint64_t>(1, info.raw_bytes / 2));
                at = r.hi + rng() % (2 * chunk_bytes);
                uint64_t kind = rng() % 4;
                r.device = kind == 0 ? -1 : static_cast<int>(rng() % static_cast<uint64_t>(devices));
                r.staged = kind == 3;
                r.expected.assign(bytes.begin() + static_cast<std::ptrdiff_t>(r.lo),
                                  bytes.begin() + static_cast<std::ptrdiff_t>(r.hi));
                regions.push_back(std::move(r));
              }
            }
            std::vector<std::pair<uint64_t, Piece>> pieces;
            std::vector<uint64_t> staged_bytes;
            std::vector<Region*> staged;
            for (Region& r : regions) {
              const uint64_t first_chunk = c->storage(r.storage).first_chunk;
              int32_t id = -1;
              if (r.device < 0) {
                r.host.assign(r.hi - r.lo, 0xEE);
              } else {
                void* p = nullptr;
                CUDA_OK(cudaSetDevice(r.device));
                CUDA_OK(cudaMalloc(&p, r.hi - r.lo));
                std::vector<uint8_t> fill(r.hi - r.lo, 0xEE);
                CUDA_OK(cudaMemcpy(p, fill.data(), fill.size(), cudaMemcpyHostToDevice));
                r.dev = static_cast<uint8_t*>(p);
              }
              if (r.staged) {
                id = static_cast<int32_t>(staged.size());
                staged.push_back(&r);
                staged_bytes.push_back(r.hi - r.lo);
              }
              for (uint64_t k = r.lo / chunk_bytes; k * chunk_bytes < r.hi; ++k) {
                uint64_t lo = std::max(k * chunk_bytes, r.lo), hi = std::min((k + 1) * chunk_bytes, r.hi);
                Piece p;
                p.chunk_offset = lo - k * chunk_bytes;
                p.bytes = hi - lo;
                p.device = r.staged ? -1 : r.device;
                p.dst = r.staged ? nullptr : (r.device < 0 ? r.host.data() : r.dev) + (lo - r.lo);
                p.staged = id;
                p.staged_offset = lo - r.lo;
                pieces.emplace_back(first_chunk + k, p);
                const uint64_t chunk_end = std::min((k + 1) * chunk_bytes, c->storage(r.storage).raw_bytes);
                seen_mid_chunk += p.chunk_offset != 0 || hi < chunk_end;
              }
              (r.device < 0 ? seen_host : r.staged ? seen_staged_device : seen_direct_device) += 1;
            }
            ASSERT_EQ(staged.size(), staged_bytes.size());
            std::shuffle(pieces.begin(), pieces.end(), rng);  // as LoadRegions' targets come: any order
            Destinations d(c->chunk_count(), std::move(pieces));
            d.staged_bytes = staged_bytes;
            loader::StagingHooks hooks;
            hooks.buffer = [&](uint32_t id) {
              Region& r = *staged[id];
              if (r.staging.empty()) r.staging.assign(r.hi - r.lo, 0);
              return r.staging.data();
            };
            hooks.complete = [&](uint32_t id) {
              Region& r = *staged[id];
              ++r.completions;
              if (r.device < 0) {
                r.host = r.staging;
              } else {  // copy_() of a pageable host tensor into a CUDA target: synchronous
                EXPECT_EQ(cudaSetDevice(r.device), cudaSuccess);
                EXPECT_EQ(cudaMemcpy(r.dev, r.staging.data(), r.staging.size(), cudaMemcpyHostToDevice), cudaSuccess);
              }
              std::vector<uint8_t>().swap(r.staging);  // freed once copied
            };
            LoadOptions o;
            o.threads = readers;
            o.slots = slots;
            o.method = method;
            o.slot_bytes = 32 << 10;
            std::vector<CudaDevice> on;
            for (int dev = 0; dev < devices; ++dev) on.push_back(CudaDevice{dev, nullptr});
            loader::StreamChunks(*c, d, o, on, hooks);
            for (Region& r : regions) {
              std::vector<uint8_t> got = r.host;
              if (r.device >= 0) {
                got.assign(r.hi - r.lo, 0);
                CUDA_OK(cudaMemcpy(got.data(), r.dev, got.size(), cudaMemcpyDeviceToHost));
                CUDA_OK(cudaFree(r.dev));
              }
              EXPECT_TRUE(got == r.expected) << "storage " << r.storage << " bytes [" << r.lo << ", " << r.hi
                                             << ") to device " << r.device << (r.staged ? ", staged" : "");
              if (r.staged) {
                EXPECT_EQ(r.completions, 1);
              }
            }
            for (const std::string& v : cudasim::TakeViolations()) ADD_FAILURE() << "cudasim: " << v;
          }
        }
      }
    }
  }
  // The test covers what it says (a fixed seed: this guards against a change that loses a kind).
  EXPECT_GT(seen_mid_chunk, 0u);
  EXPECT_GT(seen_staged_device, 0u);
  EXPECT_GT(seen_direct_device, 0u);
  EXPECT_GT(seen_host, 0u);
}

TEST_F(Sim, CorruptChunkMidStreamStopsCleanly) {
  Sample sample(4096, 0);
  const std::string bad = sample.dir.File("bad.zckpt");
  uint64_t victim = hardening::CopyWithCorruptMiddleChunk(sample.path, bad, 11, 0x10);
  auto good = Container::Open(sample.path);
  auto c = Container::Open(bad);
  for (int devices : {1, 2}) {
    Restart(devices);
    for (unsigned readers : {1u, 4u}) {
      for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE(std::to_string(devices) + " device(s), " + std::to_string(readers) + " readers");
        Target target(*good, devices, round == 1, false);
        LoadOptions o;
        o.threads = readers;
        o.slots = 2;
        o.slot_bytes = 16 << 10;
        try {
          loader::StreamChunks(*c, target.destinations(), o, target.devices(devices));
          ADD_FAILURE() << "a corrupt chunk went unnoticed";
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
          EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(victim)), std::string::npos) << e.what();
        }
        // The destinations are freed right away (as a failed Load drops its tensors): no copy may
        // still be running into them, and every slot is back.
        EXPECT_EQ(PinnedCache::Global().stats().in_use_bytes, 0u);
      }
    }
  }
}

// Chunks of 2 MiB read into pinned slots are hashed in 512 KiB pieces, each right after its
// read (format/chunk_check.h kHashPiece): a flip in the last byte of a chunk, in its last piece,
// still stops the load and names that chunk. The good file's time split shows each step taken:
// reading and hashing on the readers, copies to the device from the slots; unverified, no hashing.
TEST_F(Sim, LastPieceOfALargeChunkIsCheckedOnTheDevicePath) {
  TempDir dir;
  const std::string path = dir.File("large.zckpt"), bad = dir.File("bad.zckpt");
  hardening::WriteSampleContainer(path, 5, 6, 6 << 20, 0, 2 << 20);
  auto good = Container::Open(path);
  uint64_t victim = 0;
  for (uint64_t i = 0; i < good->chunk_count(); ++i)
    if (good->chunk(i).stored_bytes > good->chunk(victim).stored_bytes) victim = i;
  const format::ChunkRecord rec = good->chunk(victim);
  ASSERT_EQ(rec.stored_bytes, 2u << 20);
  std::vector<uint8_t> bytes = testing::ReadFileBytes(path);
  bytes[rec.offset + rec.stored_bytes - 1] ^= 0x01;
  testing::WriteFileBytes(bad, bytes);
  auto c = Container::Open(bad);
  Restart(1);
  for (unsigned readers : {1u, 2u}) {
    SCOPED_TRACE(std::to_string(readers) + " readers");
    Target target(*good, 1, false, false);
    LoadOptions o;
    o.threads = readers;
    o.slots = 2;
    o.slot_bytes = 2 << 20;
    try {
      loader::StreamChunks(*c, target.destinations(), o, target.devices(1));
      ADD_FAILURE() << "a flip in the last piece of a chunk went unnoticed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(victim) + ","), std::string::npos) << e.what();
    }
    EXPECT_EQ(PinnedCache::Global().stats().in_use_bytes, 0u);
  }
  for (bool verify : {true, false}) {
    Target target(*good, 1, false, false);
    LoadOptions o;
    o.slots = 2;
    o.slot_bytes = 2 << 20;
    o.verify = verify;
    LoadStats st = loader::StreamChunks(*good, target.destinations(), o, target.devices(1));
    EXPECT_EQ(target.Check(), "");
    EXPECT_GT(st.read_seconds, 0.0);
    EXPECT_GT(st.copy_seconds, 0.0);
    if (verify) {
      EXPECT_GT(st.hash_seconds, 0.0);
    } else {
      EXPECT_EQ(st.hash_seconds, 0.0);
    }
  }
}

// A device that reads pageable host memory through the host's page tables (Grace Hopper: the
// simulator's Config::pageable_access, cudaDeviceGetAttribute 88 and 100): raw chunks go to the
// devices straight from the file's mapping, checked there, with no ring slot filled (nothing is
// read: the time split has hashing and copying only) and no pinned memory at all; zstd chunks
// are decoded into plain host slots. The bytes are the file's, bit for bit, and a flipped byte
// still stops the load naming its chunk and storage. The same device without the attributes keeps
// the pinned ring.
TEST_F(Sim, DeviceReadingPageableMemoryCopiesFromTheMapping) {
  cudasim::Config unified = SimConfig(2);
  unified.pageable_access = true;
  for (int zstd : {0, 3}) {
    Sample sample(64 << 10, zstd);
    auto c = Container::Open(sample.path);
    for (int devices : {1, 2}) {
      for (ReadMethod method : {ReadMethod::kPread, ReadMethod::kMmap}) {
        SCOPED_TRACE(std::to_string(devices) + " device(s), " + ReadMethodName(method) + (zstd ? ", zstd" : ", raw"));
        Restart(devices, unified);
        Target target(*c, devices, /*mixed=*/devices == 2, /*split=*/false);
        LoadOptions o;
        o.threads = 3;
        o.slots = 2;
        o.slot_bytes = 128 << 10;
        o.method = method;
        LoadStats st = loader::StreamChunks(*c, target.destinations(), o, target.devices(devices));
        EXPECT_EQ(target.Check(), "");
        cudasim::Counters n = cudasim::Read();
        EXPECT_EQ(n.pinned_allocs, 0u) << "pinned memory on a device that reads pageable memory";
        uint64_t copied = 0, pageable = 0;
        for (const auto& d : n.devices) {
          copied += d.copy_bytes;
          pageable += d.pageable_copy_bytes;
        }
        EXPECT_GT(copied, 0u);
        EXPECT_EQ(pageable, copied);
        EXPECT_GT(st.hash_seconds, 0.0);
        if (zstd == 0 && devices == 1) {  // with 2, host storages beside them are read
          EXPECT_EQ(st.read_seconds, 0.0) << "raw chunks were read into slots";
        }
      }
    }
  }

  Sample sample(64 << 10, 0);
  auto good = Container::Open(sample.path);
  // Without the attributes: the ring is pinned and filled by reads.
  Restart(1);
  {
    Target target(*good, 1, false, false);
    LoadOptions o;
    o.slots = 2;
    o.slot_bytes = 128 << 10;
    LoadStats st = loader::StreamChunks(*good, target.destinations(), o, target.devices(1));
    EXPECT_EQ(target.Check(), "");
    EXPECT_GT(cudasim::Read().pinned_allocs, 0u);
    EXPECT_EQ(cudasim::Read().devices[0].pageable_copy_bytes, 0u);
    EXPECT_GT(st.read_seconds, 0.0);
  }

  const std::string bad = sample.dir.File("bad.zckpt");
  uint64_t victim = hardening::CopyWithCorruptMiddleChunk(sample.path, bad, 11, 0x10);
  auto c = Container::Open(bad);
  const std::string storage = "storage '" + c->ChunkError(ErrorKind::kCorrupt, victim, "").place().storage + "'";
  Restart(1, unified);
  for (unsigned readers : {1u, 4u}) {
    SCOPED_TRACE(std::to_string(readers) + " readers");
    Target target(*good, 1, false, false);
    LoadOptions o;
    o.threads = readers;
    o.slots = 2;
    o.slot_bytes = 128 << 10;
    try {
      loader::StreamChunks(*c, target.destinations(), o, target.devices(1));
      ADD_FAILURE() << "a corrupt chunk went unnoticed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(victim) + ","), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(storage), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(cudasim::Read().pinned_allocs, 0u);

  // A byte of the first batch rewritten in place once its copies were issued (from the progress
  // callback, which runs right after a batch is handed to the engine and before its slot is
  // reclaimed): whichever bytes the device read, the check after the copy sees the new ones.
  const std::string racing = sample.dir.File("racing.zckpt");
  testing::WriteFileBytes(racing, testing::ReadFileBytes(sample.path));
  auto r = Container::Open(racing);
  const uint64_t at = r->chunk(0).offset + 5;
  Restart(1, unified);
  Target target(*good, 1, false, false);
  LoadOptions o;
  o.threads = 1;
  o.slots = 2;
  o.slot_bytes = 128 << 10;
  bool flipped = false;
  o.progress = [&](uint64_t, uint64_t) {
    if (flipped) return;
    flipped = true;
    std::vector<uint8_t> bytes = testing::ReadFileBytes(racing);
    bytes[at] ^= 0x01;
    FILE* f = std::fopen(racing.c_str(), "r+b");  // in place: the same inode, the mapping sees it
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(at), SEEK_SET);
    std::fputc(bytes[at], f);
    std::fclose(f);
  };
  try {
    loader::StreamChunks(*r, target.destinations(), o, target.devices(1));
    ADD_FAILURE() << "bytes rewritten during the copy went unnoticed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("chunk 0,"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("written in place during the load"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(flipped);
  // Where the copy ran after the rewrite, the simulator saw its source change under it: that is
  // the race this check is for, not a misuse by the engine.
  for (const std::string& v : cudasim::TakeViolations())
    EXPECT_NE(v.find("was rewritten between enqueue and execution"), std::string::npos) << v;
}

TEST_F(Sim, CancelStopsEveryThreadAndCopy) {
  Sample sample(4096, 3);
  auto c = Container::Open(sample.path);
  for (int devices : {1, 2}) {
    Restart(devices);
    for (int delay_us : {0, 100, 1000, 5000}) {
      SCOPED_TRACE(std::to_string(devices) + " device(s), cancel after " + std::to_string(delay_us) + " us");
      Target target(*c, devices, delay_us == 100, false);
      std::atomic<bool> cancel{delay_us == 0};
      LoadOptions o;
      o.threads = 3;
      o.slots = 3;
      o.slot_bytes = 16 << 10;
      o.cancel = &cancel;
      hardening::CancelAfter canceller(cancel, delay_us);
      try {
        loader::StreamChunks(*c, target.destinations(), o, target.devices(devices));
        EXPECT_EQ(target.Check(), "");  // finished before the cancel: then it must be whole
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kCancelled) << e.what();
      }
    }
  }
}

// Loading to cuda:1 from a thread whose device is an untouched cuda:0 must not create a context
// (~0.5 GiB on a real GPU) there: the engine never switches back with cudaSetDevice (torch's
// guard restores the device in the torch-facing layer).
TEST_F(Sim, NoContextOnAnUntouchedDevice) {
  Sample sample(4096, 3);
  auto c = Container::Open(sample.path);
  Target target(*c, 1, false, false, /*first_device=*/1);  // makes device 1 current here
  std::string error;
  std::thread([&] {  // a thread whose current device is 0, which has no context
    try {
      loader::StreamChunks(*c, target.destinations(), LoadOptions{}, target.devices(1));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  EXPECT_EQ(error, "");
  cudasim::Counters counters = cudasim::Read();
  EXPECT_FALSE(counters.devices[0].context) << "loading to device 1 created a primary context on device 0";
  EXPECT_EQ(counters.devices[0].copies, 0u);
  EXPECT_GT(counters.devices[1].copies, 0u);
  EXPECT_EQ(target.Check(), "");
}

// The ring's pinned memory is taken from the per-process cache: once warm, a load page-locks
// and frees nothing, so it imposes no device-wide synchronization on streams beside it.
TEST_F(Sim, PinnedRingIsReusedAcrossCalls) {
  Sample sample(4096, 0);
  auto c = Container::Open(sample.path);
  LoadOptions o;
  o.threads = 4;
  o.slots = 6;
  o.slot_bytes = 64 << 10;
  struct PerCall {
    uint64_t allocs, frees, syncs;
  };
  auto measure = [&](uint64_t limit) {
    Restart(1);
    PinnedCache::Global().set_limit(limit);
    std::vector<PerCall> calls;
    for (int call = 0; call < 4; ++call) {
      Target target(*c, 1, false, false);
      cudasim::Counters before = cudasim::Read();
      loader::StreamChunks(*c, target.destinations(), o, target.devices(1));
      cudasim::Counters after = cudasim::Read();
      EXPECT_EQ(target.Check(), "");
      calls.push_back({after.pinned_allocs - before.pinned_allocs, after.pinned_frees - before.pinned_frees,
                       after.implicit_syncs - before.implicit_syncs});
    }
    return calls;
  };
  std::vector<PerCall> uncached = measure(0);
  std::vector<PerCall> cached = measure(PinnedCache::kDefaultLimit);
  for (size_t i = 0; i < cached.size(); ++i)
    std::cout << "call " << i << ": cache off: " << uncached[i].allocs << " pinned allocs, " << uncached[i].frees
              << " frees, " << uncached[i].syncs << " device-wide syncs; cache on: " << cached[i].allocs << ", "
              << cached[i].frees << ", " << cached[i].syncs << "\n";
  EXPECT_EQ(cached[0].allocs, *o.slots);
  for (size_t i = 1; i < cached.size(); ++i) {
    EXPECT_EQ(cached[i].allocs, 0u) << "call " << i;
    EXPECT_EQ(cached[i].frees, 0u) << "call " << i;
    EXPECT_EQ(cached[i].syncs, 0u) << "call " << i;
  }
  for (const PerCall& u : uncached) {  // what every call cost before the cache
    EXPECT_EQ(u.allocs, *o.slots);
    EXPECT_EQ(u.frees, *o.slots);
    EXPECT_EQ(u.syncs, 2 * *o.slots);
  }
}

TEST_F(Sim, PinnedCacheHoldsItsCap) {
  Sample sample(4096, 0);
  auto c = Container::Open(sample.path);
  LoadOptions o;
  o.slots = 5;
  o.slot_bytes = 64 << 10;
  const uint64_t limit = 150 << 10;  // two slots of 64 KiB + 8 KiB
  PinnedCache::Global().set_limit(limit);
  for (int call = 0; call < 3; ++call) {
    Target target(*c, 1, false, false);
    loader::StreamChunks(*c, target.destinations(), o, target.devices(1));
    EXPECT_EQ(target.Check(), "");
    PinnedCache::Stats s = PinnedCache::Global().stats();
    EXPECT_LE(s.cached_bytes, limit);
    EXPECT_GT(s.cached_bytes, 0u);
    EXPECT_EQ(cudasim::Read().pinned_live_bytes, s.cached_bytes);
  }
}

TEST_F(Sim, PinnedMemoryExhaustedIsOutOfMemory) {
  cudasim::Config config = SimConfig(1);
  config.pinned_bytes = 100 << 10;  // one 64 KiB slot fits, two do not
  Restart(1, config);
  Sample sample(4096, 0);
  auto c = Container::Open(sample.path);
  Target target(*c, 1, false, false);
  LoadOptions o;
  o.slots = 4;
  o.slot_bytes = 64 << 10;
  try {
    loader::StreamChunks(*c, target.destinations(), o, target.devices(1));
    FAIL() << "loaded with too little pinned memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory) << e.what();
    EXPECT_NE(std::string(e.what()).find("cudaHostAlloc"), std::string::npos) << e.what();
  }
  (void)cudaGetLastError();
}

TEST_F(Sim, ConcurrentLoadsShareTheCache) {
  Sample sample(4096, 3);
  auto c = Container::Open(sample.path);
  std::vector<std::string> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        try {
          Target target(*c, 2, t % 2 == 1, t == 2);
          LoadOptions o;
          o.threads = 1 + static_cast<unsigned>(t);
          o.slots = 2 + static_cast<unsigned>(round);
          o.slot_bytes = 32 << 10;
          loader::StreamChunks(*c, target.destinations(), o, target.devices(2));
          results[static_cast<size_t>(t)] += target.Check();
        } catch (const std::exception& e) {
          results[static_cast<size_t>(t)] += e.what();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(results[static_cast<size_t>(t)], "") << "thread " << t;
}

}  // namespace
}  // namespace zckpt
