// How loads stop: a corrupt chunk mid-stream (named precisely, nothing returned, no thread left
// behind, repeatedly), cancellation, and the same through LoadInto.
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <atomic>

#include "loader/tensors.h"
#include "loader_test_util.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/loader.h"

// OutOfMemory.HostAllocationFailureIsOutOfMemory asks the allocator for 4 PiB and expects the
// failure back as an error. ASan's allocator aborts on a request that size unless told to return
// null (as glibc's does), so this suite's ASan builds are told; the other suites keep the abort,
// which catches an oversized allocation taken from a hostile file.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZCKPT_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(ZCKPT_TEST_ASAN)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace zckpt {
namespace {

using testing::Fixture;
using testing::SmallChunks;

const c10::Device kCpu(c10::kCPU);

// Storages before and after the damaged one, so the error comes mid-stream with readers busy.
Fixture Streamed(int zstd) {
  Fixture f;
  for (int i = 0; i < 6; ++i) {
    std::string name = "layer" + std::to_string(i) + ".weight";
    if (zstd) {
      f.AddStorage("s" + name, testing::CompressibleBytes(200000, i), DType::kFloat32);
      f.AddTensor(name, i, DType::kFloat32, {50000}, {1});
    } else {
      f.AddContiguous(name, DType::kFloat32, {500, 100}, i);
    }
  }
  return f;
}

struct Damage {
  uint64_t chunk;
  uint64_t file_offset;
};

// Flips a bit in the middle of the 3rd storage's 2nd chunk.
Damage DamageThirdStorage(const std::string& path) {
  auto c = Container::Open(path);
  StorageInfo s = c->storage(2);
  uint64_t chunk = s.first_chunk + 1;
  format::ChunkRecord r = c->chunk(chunk);
  Damage d{chunk, r.offset + r.stored_bytes / 2};
  testing::FlipBit(path, d.file_offset);
  return d;
}

void ExpectNamesTheChunk(const Error& e, const std::string& path, uint64_t chunk) {
  std::string m = e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << m;
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_NE(m.find("'slayer2.weight'"), std::string::npos) << m;  // storage key
  EXPECT_NE(m.find("layer2.weight"), std::string::npos) << m;     // tensor
  EXPECT_NE(m.find("chunk " + std::to_string(chunk)), std::string::npos) << m;
  EXPECT_NE(m.find("storage bytes [4096, 8192)"), std::string::npos) << m;
  EXPECT_NE(m.find("file bytes ["), std::string::npos) << m;
}

class Corrupt : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Corrupt, ChunkMidStreamStopsCleanlyEveryTime) {
  auto [zstd, direct] = GetParam();
  testing::TempDir dir;
  std::string path = Streamed(zstd).WriteIn(dir, "bad.zckpt", SmallChunks(4096, zstd ? 3 : 0));
  Damage d = DamageThirdStorage(path);
  size_t threads_before = testing::ThreadCount();
  for (int round = 0; round < 50; ++round) {
    LoadOptions o;
    o.threads = 4;
    o.slots = 2;
    o.slot_bytes = 8192;
    o.cpu_read_into_destination = direct;
    o.method = round % 3 == 0 ? ReadMethod::kMmap : ReadMethod::kPread;
    try {
      LoadResult r = Load(path, kCpu, o);
      FAIL() << "loaded a corrupt file, " << r.tensors.size() << " tensors";
    } catch (const Error& e) {
      ExpectNamesTheChunk(e, path, d.chunk);
    }
    EXPECT_EQ(testing::ThreadCountSettled(threads_before), threads_before) << "round " << round;
  }
  // Without verification raw chunks load (zstd frames are still decoded, so may still fail).
  if (!zstd) {
    LoadOptions o;
    o.verify = false;
    EXPECT_NO_THROW(Load(path, kCpu, o));
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Corrupt, ::testing::Combine(::testing::Values(0, 1), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "zstd" : "raw") +
                                  (std::get<1>(info.param) ? "_into_destination" : "_through_ring");
                         });

TEST(Corrupt, LoadIntoStopsWithTheSameError) {
  testing::TempDir dir;
  std::string path = dir.File("bad.zckpt");
  Fixture f = Streamed(0);
  f.Write(path, SmallChunks());
  Damage d = DamageThirdStorage(path);
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (const auto& t : f.tensors()) targets.emplace_back(t.name, at::zeros(t.shape, at::kFloat));
  LoadIntoOptions o;
  o.base.threads = 3;
  try {
    LoadInto(path, targets, o);
    FAIL();
  } catch (const Error& e) {
    ExpectNamesTheChunk(e, path, d.chunk);
  }
}

TEST(Cancel, FromTheProgressCallbackMidLoad) {
  testing::TempDir dir;
  std::string path = Streamed(0).WriteIn(dir, "c.zckpt");
  size_t threads_before = testing::ThreadCount();
  for (bool direct : {true, false}) {
    std::atomic<bool> cancel{false};
    int calls = 0;
    LoadOptions o;
    o.slot_bytes = 8192;
    o.slots = 2;
    o.threads = 3;
    o.cpu_read_into_destination = direct;
    o.cancel = &cancel;
    o.progress = [&](uint64_t, uint64_t) {
      if (++calls == 3) cancel = true;
    };
    try {
      Load(path, kCpu, o);
      FAIL() << "not cancelled";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCancelled) << e.what();
    }
    EXPECT_LT(calls, 60);
    EXPECT_EQ(testing::ThreadCountSettled(threads_before), threads_before);
  }
}

TEST(Cancel, BeforeTheStart) {
  testing::TempDir dir;
  std::string path = Streamed(0).WriteIn(dir, "c.zckpt");
  std::atomic<bool> cancel{true};
  LoadOptions o;
  o.cancel = &cancel;
  try {
    Load(path, kCpu, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCancelled);
  }
}

// Running out of memory is an error of its own kind (Python: zckpt.OutOfMemoryError, a
// torch.OutOfMemoryError), so resume code can tell it from a damaged file or an I/O error.
TEST(OutOfMemory, TorchsOutOfMemoryErrorIsItsOwnKind) {
  try {
    loader::WithTorchErrors([]() -> int {
      // What the CUDA caching allocator throws.
      C10_THROW_ERROR(OutOfMemoryError, "CUDA out of memory. Tried to allocate 2.00 GiB");
    });
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory) << e.what();
    EXPECT_NE(std::string(e.what()).find("Tried to allocate 2.00 GiB"), std::string::npos) << e.what();
  }
  try {
    loader::WithTorchErrors([]() -> int { TORCH_CHECK(false, "some other failure"); });
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  }
  EXPECT_STREQ(ErrorKindName(ErrorKind::kOutOfMemory), "out-of-memory");
}

TEST(OutOfMemory, HostAllocationFailureIsOutOfMemory) {
  try {
    (void)loader::AllocateBytes(uint64_t{1} << 52, kCpu);  // 4 PiB
    FAIL() << "allocated 4 PiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(uint64_t{1} << 52)), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zckpt
