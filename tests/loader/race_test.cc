// The LibTorch-facing loaders (Load, LoadStorages, LoadInto) on files that change under them
// (issue 11, items 1-2), and tensor records at the int64 bounds (item 4). (The reads under them,
// Container::ReadChunk included, are raced the same way torch-free in
// tests/hardening/file_race_test.cc.)
//
// A file truncated during a load ends in Error(kIo) naming it, with every read method; a load
// racing a thread that truncates and restores the file delivers the original tensors or an error;
// tensors without elements keep large (legal) storage offsets as positive int64_t, and offsets
// beyond int64 are refused before torch sees them.
#include <unistd.h>

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <fcntl.h>
#include <random>
#include <thread>

#include "container_model.h"
#include "loader_test_util.h"
#include "zckpt/container.h"
#include "zckpt/loader.h"

namespace zckpt::testing {
namespace {

bool Shrank(const Error& e, const std::string& path) {
  std::string m = e.what();
  return e.kind() == ErrorKind::kIo && m.find(path) != std::string::npos && m.find("changed size") != std::string::npos;
}

// A checkpoint published by rename while loads run (issue 22, part 1): `latest` is A or B,
// renamed over the path in a loop; every load must be all of A or all of B (each load reads its
// index and every chunk through one open file, whatever the path names meanwhile).
// The versions' indexes differ too (B's tensor i lives in storage 3 - i), so one file's index
// with the other's chunks is caught, not only chunks of both.
std::string WriteVersion(const TempDir& dir, const std::string& name, uint64_t seed, bool reversed) {
  Fixture f;
  for (int i = 0; i < 4; ++i) f.AddStorage("s" + std::to_string(i), RandomBytes(256 << 10, seed * 10 + i), DType::kFloat32);
  for (int i = 0; i < 4; ++i) f.AddTensor("t" + std::to_string(i), reversed ? 3 - i : i, DType::kFloat32, {256 << 8}, {1});
  return f.WriteIn(dir, name, SmallChunks(16 << 10, 0));
}

// Which version every tensor of `tensors` is (0 or 1), or -1 when they disagree or match neither.
int VersionOf(const std::map<std::string, at::Tensor>& got, const std::vector<LoadResult>& versions) {
  for (int v = 0; v < 2; ++v) {
    bool all = true;
    for (int i = 0; i < 4 && all; ++i) {
      const std::string name = "t" + std::to_string(i);
      all = got.count(name) && SameBytes(got.at(name), versions[v].get(name));
    }
    if (all) return v;
  }
  return -1;
}

const ReadMethod kPublishMethods[] = {ReadMethod::kPread, ReadMethod::kMmap, ReadMethod::kDirect};

TEST(LoadRace, LoadsRacingARenamingPublisherGiveOneWholeVersion) {
  TempDir dir;
  const std::string a = WriteVersion(dir, "a.zckpt", 1, false), b = WriteVersion(dir, "b.zckpt", 2, true);
  const std::vector<LoadResult> versions = {Load(a, c10::Device("cpu")), Load(b, c10::Device("cpu"))};
  const std::string latest = dir.File("latest.zckpt"), tmp = dir.File("latest.publishing");
  ASSERT_EQ(::link(a.c_str(), latest.c_str()), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> renames{0};
  std::thread publisher([&] {
    for (int i = 1; !stop; ++i) {  // B first: `latest` starts as A
      if (::link((i % 2 ? b : a).c_str(), tmp.c_str()) != 0 || ::rename(tmp.c_str(), latest.c_str()) != 0) {
        ADD_FAILURE() << "publisher: " << std::strerror(errno);
        return;
      }
      renames++;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  int seen[2] = {0, 0}, mixed = 0;
  for (int n = 0; n < 60; ++n) {
    LoadOptions o;
    o.method = kPublishMethods[n % 3];
    o.threads = 2;
    o.slot_bytes = 16 << 10;  // many small reads: renames land inside the load
    std::map<std::string, at::Tensor> got;
    if (n % 4 == 3) {
      MapOptions mo;
      mo.verify = true;
      MapResult m = Map(latest, mo);
      for (const auto& [name, t] : m.tensors) got[name] = t.clone();
    } else {
      LoadResult r = Load(latest, c10::Device("cpu"), o);
      for (const auto& [name, t] : r.tensors) got[name] = t;
    }
    int v = VersionOf(got, versions);
    if (v < 0) mixed++;
    else seen[v]++;
  }
  stop = true;
  publisher.join();
  EXPECT_EQ(mixed, 0) << "loads mixing A and B (A whole: " << seen[0] << ", B whole: " << seen[1] << ")";
  EXPECT_GT(renames.load(), 0);
}

// Three 256 KiB storages (one compressible, so zstd chunks), 64 KiB chunks.
std::string WriteSample(const TempDir& dir, int zstd) {
  Fixture f;
  f.AddStorage("a", RandomBytes(256 << 10, 1), DType::kFloat32);
  f.AddTensor("a", 0, DType::kFloat32, {256 << 8}, {1});
  f.AddStorage("b", CompressibleBytes(256 << 10, 2), DType::kFloat32);
  f.AddTensor("b", 1, DType::kFloat32, {256, 256}, {256, 1});
  f.AddStorage("c", RandomBytes(256 << 10, 3), DType::kFloat32);
  f.AddTensor("c", 2, DType::kFloat32, {256 << 8}, {1});
  return f.WriteIn(dir, "race.zckpt", SmallChunks(64 << 10, zstd));
}

const ReadMethod kMethods[] = {ReadMethod::kPread, ReadMethod::kMmap, ReadMethod::kDirect};

// One slot: the readers wait for each delivery, and the first delivery truncates the file.
LoadOptions TruncatingOptions(ReadMethod method, const std::string& path, int* calls) {
  LoadOptions o;
  o.method = method;
  o.slots = 1;
  o.threads = 2;
  o.slot_bytes = 64 << 10;
  o.cpu_read_into_destination = false;
  o.progress = [path, calls](uint64_t, uint64_t) {
    if ((*calls)++ == 0) {
      ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
    }
  };
  return o;
}

TEST(LoadRace, ShrunkDuringLoadIsAnIoErrorNamingTheFile) {
  for (int zstd : {0, 3}) {
    for (ReadMethod method : kMethods) {
      for (int api = 0; api < 3; ++api) {
        SCOPED_TRACE(std::string(ReadMethodName(method)) + (zstd ? ", zstd" : ", raw") + ", api " + std::to_string(api));
        TempDir dir;
        std::string path = WriteSample(dir, zstd);
        int calls = 0;
        LoadOptions o = TruncatingOptions(method, path, &calls);
        try {
          if (api == 0) {
            (void)Load(path, c10::Device("cpu"), o);
          } else if (api == 1) {
            (void)LoadStorages(path, c10::Device("cpu"), o);
          } else {
            at::Tensor a = at::empty({256 << 8}, at::kFloat), b = at::empty({256, 256}, at::kFloat),
                       c = at::empty({256 << 8}, at::kFloat);
            LoadIntoOptions io;
            io.base = o;
            (void)LoadInto(path, {{"a", a}, {"b", b}, {"c", c}}, io);
          }
          ADD_FAILURE() << "a load went on past the truncation";
        } catch (const Error& e) {
          EXPECT_TRUE(Shrank(e, path)) << e.what();
        }
        EXPECT_GE(calls, 1);
      }
    }
  }
}

// A thread truncates the file and writes it back, again and again, while Load loops with each
// method: every load gives the original tensors or an error (never a crash, never other bytes).
TEST(LoadRace, LoadRacingTruncationGivesTheOriginalOrAnError) {
  TempDir dir;
  std::string path = WriteSample(dir, 3);
  const std::vector<uint8_t> original = ReadFileBytes(path);
  LoadResult good = Load(path, c10::Device("cpu"));
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  std::atomic<bool> stop{false};
  std::thread changer([&] {
    std::mt19937_64 rng(3);
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      (void)!::ftruncate(fd, static_cast<off_t>(rng() % original.size()));
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
      (void)!::pwrite(fd, original.data(), original.size(), 0);
    }
  });
  int ok = 0, shrank = 0, other = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (int n = 0; n < 30 || std::chrono::steady_clock::now() < end; ++n) {
    LoadOptions o;
    o.method = kMethods[n % 3];
    o.cpu_read_into_destination = n % 2 == 0;
    try {
      LoadResult r = Load(path, c10::Device("cpu"), o);
      for (const auto& [name, t] : good.tensors) ASSERT_TRUE(SameBytes(r.get(name), t)) << name;
      ++ok;
    } catch (const Error& e) {
      EXPECT_TRUE(e.kind() == ErrorKind::kIo || e.kind() == ErrorKind::kCorrupt || e.kind() == ErrorKind::kNotContainer)
          << e.what();
      if (Shrank(e, path)) ++shrank;
      else ++other;
    }
  }
  stop = true;
  changer.join();
  ::close(fd);
  EXPECT_GT(shrank, 0) << "no load met the truncation: the race did not happen";
  std::printf("load race: %d loads complete, %d met a shrunk file, %d other errors\n", ok, shrank, other);
}

// --- int64 bounds (item 4) ---

// SmallContainer-like file with an empty float32 tensor "e" over a 16-byte storage.
std::vector<uint8_t> EmptyTensorFile(uint64_t storage_offset) {
  TempDir dir;
  Fixture f;
  f.AddStorage("s", RandomBytes(16, 1), DType::kFloat32);
  f.AddTensor("e", 0, DType::kFloat32, {0, 3}, {3, 1});
  ContainerModel m = ContainerModel::Parse(ReadFileBytes(f.WriteIn(dir, "e.zckpt")));
  m.tensors[0].storage_offset = storage_offset;
  return m.Build();
}

TEST(LoadInt64, EmptyTensorKeepsALargeStorageOffset) {
  TempDir dir;
  const uint64_t largest = ((1ull << 63) - 1) / 4;  // float32: the largest byte offset that fits
  std::string path = dir.File("ok.zckpt");
  WriteFileBytes(path, EmptyTensorFile(largest));
  LoadResult r = Load(path, c10::Device("cpu"));
  at::Tensor e = r.get("e");
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.storage_offset(), static_cast<int64_t>(largest));
  EXPECT_EQ(e.sizes(), (std::vector<int64_t>{0, 3}));
}

TEST(LoadInt64, StorageOffsetBeyondInt64IsRefusedBeforeTorch) {
  for (uint64_t offset : {1ull << 63, ~0ull, 1ull << 61}) {
    TempDir dir;
    std::string path = dir.File("bad.zckpt");
    WriteFileBytes(path, EmptyTensorFile(offset));
    try {
      (void)Load(path, c10::Device("cpu"));
      ADD_FAILURE() << "loaded storage_offset " << offset;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find("storage_offset x element size is more than 2^63 - 1"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace zckpt::testing
