// The CUDA path (pinned ring, cudaMemcpyAsync, events). Built everywhere torch is a CUDA build;
// every case skips without a device.
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>

#include "loader_test_util.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/load_regions.h"
#include "zckpt/loader.h"
#include "zckpt/memory_stats.h"

namespace zckpt {
namespace {

using testing::Fixture;
using Targets = std::vector<std::pair<std::string, at::Tensor>>;

const c10::Device kCuda(c10::kCUDA, 0);

// Large storages (several chunks each, one larger than the ring), small ones packed, views.
Fixture Model() {
  Fixture f;
  f.AddContiguous("embed", DType::kBFloat16, {4096, 1024}, 1);  // 8 MiB
  for (int i = 0; i < 8; ++i) f.AddContiguous("layer" + std::to_string(i), DType::kFloat32, {512, 256 + i}, 10 + i);
  for (int i = 0; i < 50; ++i) f.AddContiguous("norm" + std::to_string(i), DType::kFloat32, {64 + i}, 100 + i);
  uint32_t s = f.AddStorage("flat", testing::RandomBytes(100000 * 4, 7), DType::kFloat32);
  f.AddTensor("flat.a", s, DType::kFloat32, {300, 100}, {100, 1}, 11);
  f.AddTensor("flat.t", s, DType::kFloat32, {100, 300}, {1, 100}, 11);
  return f;
}

uint64_t StorageBytes(const Fixture& f) {
  uint64_t n = 0;
  for (const auto& s : f.storages()) n += f.bytes(s.key).size();
  return n;
}

// Skips without a device; else writes Model() with 64 KiB chunks.
class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount says none, or no CUDA build)";
    path_ = f_.WriteIn(dir_, "m.zckpt", testing::SmallChunks(64 << 10));
  }
  LoadResult OnCpu() const { return Load(path_, c10::Device(c10::kCPU)); }

  testing::TempDir dir_;
  Fixture f_ = Model();
  std::string path_;
};

TEST_F(Cuda, LoadMatchesTheCpuLoad) {
  LoadResult cpu = OnCpu();
  for (unsigned slots : {1u, 2u, 4u}) {
    LoadOptions o;
    o.slot_bytes = 128 << 10;  // the 8 MiB tensor laps the ring many times
    o.slots = slots;
    o.threads = 3;
    LoadResult gpu = Load(path_, kCuda, o);
    for (const auto& [name, t] : gpu.tensors) {
      EXPECT_TRUE(t.is_cuda()) << name;
      EXPECT_TRUE(testing::SameBytes(t.cpu(), cpu.get(name))) << name;
    }
    EXPECT_EQ(gpu.get("flat.a").storage().data_ptr().get(), gpu.get("flat.t").storage().data_ptr().get());
    EXPECT_EQ(gpu.stats.destination_chunks, 0u);
    EXPECT_GT(gpu.stats.ring_bytes, 0u);
  }
}

TEST_F(Cuda, DevicePeakIsTheDestination) {
  (void)Load(path_, kCuda);  // warm up torch's CUDA state
  ResetDevicePeak(0);
  DeviceMemory before = ReadDeviceMemory(0);
  LoadResult r = Load(path_, kCuda);
  DeviceMemory after = ReadDeviceMemory(0);
  uint64_t destination = StorageBytes(f_);
  // The caching allocator rounds each allocation up to 512 bytes; nothing else is allocated
  // on the device (chunks are decoded on the host): at most one chunk of slack.
  uint64_t rounding = 512 * f_.storages().size();
  EXPECT_LE(after.peak_allocated - before.allocated, destination + rounding + (64 << 10));
  EXPECT_GE(after.peak_allocated - before.allocated, destination);
  // What the driver sees: the allocator's segments (2 MiB / 20 MiB granules) around the same,
  // measured while the result is alive.
  EXPECT_LE(before.free - after.free, destination + 64 * (1 << 20));
  EXPECT_LE(after.peak_reserved - before.reserved, destination + 64 * (1 << 20));
}

// A mixed-device load (a dict map_location, CPU storages in a mostly-CUDA file): the device
// receives its own storages only, in the same pass; none is parked there and moved off later.
TEST_F(Cuda, MixedDevicesEachStorageOnItsOwnDevice) {
  LoadResult cpu = OnCpu();
  std::map<std::string, c10::Device> where;
  uint64_t cuda_bytes = 0;
  size_t n = 0;
  for (const auto& s : f_.storages()) {
    bool on_cuda = n++ % 3 != 0;  // a third stays on the host, the 8 MiB embedding among them
    where.emplace(s.key, on_cuda ? kCuda : c10::Device(c10::kCPU));
    if (on_cuda) cuda_bytes += f_.bytes(s.key).size();
  }
  (void)Load(path_, kCuda);  // warm up torch's CUDA state
  ResetDevicePeak(0);
  DeviceMemory before = ReadDeviceMemory(0);
  LoadResult r = LoadStorages(path_, where, c10::Device(c10::kCPU));
  DeviceMemory after = ReadDeviceMemory(0);
  EXPECT_LE(after.peak_allocated - before.allocated, cuda_bytes + 512 * f_.storages().size());
  EXPECT_GE(after.peak_allocated - before.allocated, cuda_bytes);
  for (const auto& [key, t] : r.storages_by_key) {
    EXPECT_EQ(t.device(), where.at(key)) << key;
    EXPECT_TRUE(testing::SameBytes(t.cpu(), cpu.storages_by_key.at(key))) << key;
  }
}

TEST_F(Cuda, LoadIntoKeepsPointersAndAllocatesNothing) {
  LoadResult cpu = OnCpu();
  Targets targets;
  for (const auto& [name, t] : cpu.tensors) targets.emplace_back(name, at::zeros(t.sizes(), t.options().device(kCuda)));
  std::vector<void*> ptrs;
  for (const auto& t : targets) ptrs.push_back(t.second.data_ptr());
  ResetDevicePeak(0);
  DeviceMemory before = ReadDeviceMemory(0);
  LoadIntoOptions o;
  o.base.slot_bytes = 128 << 10;
  LoadIntoReport r = LoadInto(path_, targets, o);
  DeviceMemory after = ReadDeviceMemory(0);
  for (size_t i = 0; i < targets.size(); ++i) {
    EXPECT_EQ(targets[i].second.data_ptr(), ptrs[i]);
    EXPECT_TRUE(testing::SameBytes(targets[i].second.cpu(), cpu.get(targets[i].first))) << targets[i].first;
  }
  EXPECT_EQ(r.tensors_staged, 1u);  // flat.t: transposed view
  // Direct tensors take nothing; the staged one may take its own size for copy_.
  EXPECT_LE(after.peak_allocated - before.allocated, 300u * 100 * 4 + 512);
}

// What a DCP reader (zckpt/dcp.py) asks of a GPU rank: boxes of saved tensors into CUDA targets.
// A row box is streamed straight in from mid-chunk; a column box and a box of a transposed view
// go through a host buffer and copy_() (a host-to-device copy); one target is not contiguous.
TEST_F(Cuda, LoadRegionsFillsBoxesOfCudaTargets) {
  LoadResult cpu = OnCpu();
  const at::Tensor embed = cpu.get("embed"), flat_t = cpu.get("flat.t");
  auto on_cuda = [](const at::Tensor& like) { return at::zeros(like.sizes(), like.options().device(kCuda)); };
  at::Tensor rows = on_cuda(embed.narrow(0, 1000, 2000));
  at::Tensor cols = on_cuda(embed.narrow(1, 100, 512));
  at::Tensor box_t = on_cuda(flat_t.narrow(0, 10, 50).narrow(1, 20, 200));
  at::Tensor strided = on_cuda(embed.narrow(0, 7, 300).narrow(1, 3, 40).t()).t();  // column-major target
  std::vector<Region> regions = {{"embed", {1000, 0}, {2000, 1024}, rows},
                                 {"embed", {0, 100}, {4096, 512}, cols},
                                 {"flat.t", {10, 20}, {50, 200}, box_t},
                                 {"embed", {7, 3}, {300, 40}, strided}};
  for (unsigned slots : {1u, 3u}) {
    for (const Region& r : regions) r.target.zero_();
    LoadOptions o;
    o.slot_bytes = 128 << 10;
    o.slots = slots;
    o.threads = 3;
    LoadRegionsReport rep = LoadRegions(path_, regions, o);
    EXPECT_EQ(rep.regions, 4u);
    EXPECT_EQ(rep.direct, 1u);  // the row box
    EXPECT_EQ(rep.staged, 3u);
    EXPECT_TRUE(testing::SameBytes(rows.cpu(), embed.narrow(0, 1000, 2000).contiguous()));
    EXPECT_TRUE(testing::SameBytes(cols.cpu(), embed.narrow(1, 100, 512).contiguous()));
    EXPECT_TRUE(testing::SameBytes(box_t.cpu(), flat_t.narrow(0, 10, 50).narrow(1, 20, 200).contiguous()));
    EXPECT_TRUE(testing::SameBytes(strided.cpu().contiguous(), embed.narrow(0, 7, 300).narrow(1, 3, 40).contiguous()));
  }
}

TEST_F(Cuda, CorruptChunkStopsCleanly) {
  auto c = Container::Open(path_);
  uint64_t chunk = c->storage(3).first_chunk + 1;
  testing::FlipBit(path_, c->chunk(chunk).offset + 7);
  size_t threads = testing::ThreadCount();
  DeviceMemory before = ReadDeviceMemory(0);
  for (int round = 0; round < 20; ++round) {
    LoadOptions o;
    o.slot_bytes = 128 << 10;
    o.slots = 2;
    o.threads = 4;
    try {
      Load(path_, kCuda, o);
      FAIL() << "loaded a corrupt file";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(chunk)), std::string::npos) << e.what();
    }
    EXPECT_LE(testing::ThreadCountSettled(threads + 1), threads + 1);  // + a CUDA runtime thread at most
  }
  EXPECT_EQ(ReadDeviceMemory(0).allocated, before.allocated) << "destinations leaked";
}

TEST_F(Cuda, Cancel) {
  std::atomic<bool> cancel{false};
  LoadOptions o;
  o.slot_bytes = 64 << 10;
  o.cancel = &cancel;
  o.progress = [&](uint64_t done, uint64_t) {
    if (done > (1 << 20)) cancel = true;
  };
  try {
    Load(path_, kCuda, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCancelled);
  }
}

TEST(CudaBuild, SaysWhetherItHasADevice) {
  // Always runs: says whether this build has the CUDA path and a device.
#if ZCKPT_WITH_CUDA
  std::cout << "built with CUDA; device present: " << (CudaAvailable() ? "yes" : "no") << "\n";
#else
  std::cout << "built without CUDA\n";
  EXPECT_FALSE(CudaAvailable());
#endif
}

}  // namespace
}  // namespace zckpt
