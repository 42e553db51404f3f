// Map: tensors alias a copy-on-write mapping of the file (pointers inside the mapping, at the
// chunk offsets), nothing is read, writes stay private, zstd storages are decoded.
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "format/container_file.h"
#include "loader/map_verify.h"
#include "loader_test_util.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/load_ranges.h"
#include "zckpt/loader.h"
#include "zckpt/memory_stats.h"

namespace zckpt {
namespace {

using format::internal::ContainerFile;
using testing::Fixture;
using testing::SmallChunks;

// [begin, end) of the mappings of `path` in this process (/proc/self/maps).
std::vector<std::pair<uintptr_t, uintptr_t>> MappingsOf(const std::string& path) {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.size() < path.size() || line.compare(line.size() - path.size(), path.size(), path) != 0) continue;
    std::istringstream in(line);
    std::string range;
    in >> range;
    size_t dash = range.find('-');
    out.emplace_back(std::stoull(range.substr(0, dash), nullptr, 16), std::stoull(range.substr(dash + 1), nullptr, 16));
  }
  return out;
}

bool Inside(const void* p, const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges) {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [b, e] : ranges)
    if (a >= b && a < e) return true;
  return false;
}

TEST(Map, TensorsAliasTheMapping) {
  testing::TempDir dir;
  Fixture f;
  f.AddContiguous("w", DType::kFloat32, {300, 100}, 1);
  f.AddContiguous("b", DType::kBFloat16, {77}, 2);
  uint32_t s = f.AddStorage("flat", testing::RandomBytes(4000, 3), DType::kFloat32);
  f.AddTensor("v", s, DType::kFloat32, {10, 10}, {1, 10}, 5);
  f.AddTensor("v2", s, DType::kFloat32, {20}, {1}, 100);
  std::string path = f.WriteIn(dir, "map.zckpt");

  MapResult m = Map(path);
  auto ranges = MappingsOf(path);
  ASSERT_FALSE(ranges.empty());
  auto c = Container::Open(path);
  const auto* w0 = static_cast<const uint8_t*>(m.storages_by_key.at("sw").data_ptr());
  for (uint32_t i = 0; i < c->storage_count(); ++i) {
    StorageInfo info = c->storage(i);
    const auto* p = static_cast<const uint8_t*>(m.storages_by_key.at(std::string(info.key)).data_ptr());
    EXPECT_TRUE(Inside(p, ranges)) << info.key;
    // At the storage's own place in the file: the mapping, not a copy.
    EXPECT_EQ(p - w0, static_cast<ptrdiff_t>(info.data_offset) - static_cast<ptrdiff_t>(c->storage(0).data_offset));
    EXPECT_TRUE(testing::BytesOf(m.storages_by_key.at(std::string(info.key))) == f.bytes(std::string(info.key)));
  }
  EXPECT_EQ(m.get("v").storage().data_ptr().get(), m.get("v2").storage().data_ptr().get());
  EXPECT_EQ(m.get("v").strides(), c10::IntArrayRef({1, 10}));
  EXPECT_EQ(m.get("v").storage_offset(), 5);
  LoadResult l = Load(path, c10::Device(c10::kCPU));
  for (const auto& [name, t] : m.tensors) EXPECT_TRUE(testing::SameBytes(t, l.get(name))) << name;
  EXPECT_EQ(m.stats.decoded_bytes, 0u);
  EXPECT_EQ(m.stats.mapped_bytes, 300u * 100 * 4 + 77 * 2 + 4000);
}

TEST(Map, WritesStayPrivateAndTensorsOutliveTheResult) {
  testing::TempDir dir;
  Fixture f;
  f.AddContiguous("w", DType::kInt32, {1000}, 1);
  std::string path = f.WriteIn(dir, "cow.zckpt");
  std::vector<uint8_t> before = testing::ReadFileBytes(path);
  at::Tensor w;
  {
    MapResult m = Map(path);
    w = m.get("w");
  }
  int32_t first = w[0].item<int32_t>();
  w.data_ptr<int32_t>()[0] = first + 1;  // copy-on-write page
  EXPECT_EQ(w[0].item<int32_t>(), first + 1);
  EXPECT_TRUE(testing::ReadFileBytes(path) == before);
  w = at::Tensor();
  EXPECT_TRUE(MappingsOf(path).empty()) << "mapping not released with the last tensor";
}

TEST(Map, CompressedStoragesAreDecoded) {
  testing::TempDir dir;
  Fixture f;
  f.AddStorage("z", testing::CompressibleBytes(100000, 1), DType::kFloat32);
  f.AddTensor("z", 0, DType::kFloat32, {25000}, {1});
  f.AddContiguous("r", DType::kFloat32, {1000}, 2);  // random: stays raw, mapped
  std::string path = f.WriteIn(dir, "z.zckpt", SmallChunks(4096, 3));
  MapResult m = Map(path);
  EXPECT_EQ(m.stats.decoded_bytes, 100000u);
  EXPECT_EQ(m.stats.mapped_bytes, 4000u);
  EXPECT_TRUE(testing::BytesOf(m.storages_by_key.at("z")) == f.bytes("z"));
  EXPECT_TRUE(testing::BytesOf(m.storages_by_key.at("sr")) == f.bytes("sr"));
}

// Each storage's bytes are kept by what they need alone: the file's mapping for an aliased storage,
// its own buffer for a decoded one, so views of one never keep another's memory.
TEST(Map, EachStorageKeepsOnlyItsOwnBytes) {
  testing::TempDir dir;
  Fixture f;
  f.AddStorage("z", testing::CompressibleBytes(100000, 1), DType::kFloat32);
  f.AddTensor("z", 0, DType::kFloat32, {25000}, {1});
  f.AddContiguous("r", DType::kFloat32, {1000}, 2);
  std::string path = f.WriteIn(dir, "z.zckpt", SmallChunks(4096, 3));
  auto c = Container::Open(path);
  const size_t opened = MappingsOf(path).size();  // the container's own (its index)
  std::shared_ptr<const void> decoded, raw;
  {
    MappedStorages m(*c, true, 2);
    for (uint32_t s = 0; s < c->storage_count(); ++s) (c->storage(s).key == "z" ? decoded : raw) = m.keeper(s);
    ASSERT_TRUE(decoded && raw);
    EXPECT_NE(decoded, raw);
  }
  EXPECT_EQ(decoded.use_count(), 1) << "the decoded storage is held by something else";
  EXPECT_GT(MappingsOf(path).size(), opened) << "the aliased storage's keeper does not hold the mapping";
  raw.reset();
  EXPECT_EQ(MappingsOf(path).size(), opened) << "the decoded storage's keeper holds the mapping";
  // Map's tensors the same way: the decoded one alone keeps no mapping.
  MapResult m = Map(*c);
  at::Tensor z = m.storages_by_key.at("z");
  EXPECT_GT(MappingsOf(path).size(), opened);
  m = MapResult();
  EXPECT_EQ(MappingsOf(path).size(), opened);
  EXPECT_TRUE(testing::BytesOf(z) == f.bytes("z"));
}

TEST(Map, QuantizedTensorsRefusedButTheirStoragesMap) {
  testing::TempDir dir;
  Fixture f;
  f.AddContiguous("q", DType::kQUInt8, {4096}, 1);
  std::string path = f.WriteIn(dir, "q.zckpt");
  EXPECT_THROW(Map(path), Error);
  MapResult m = MapStorages(path);
  EXPECT_TRUE(m.tensors.empty());
  EXPECT_TRUE(testing::BytesOf(m.storages_by_key.at("sq")) == f.bytes("sq"));
}

// verify: every chunk of the mapped storages is hashed in the mapping before Map returns; a
// flipped bit anywhere in them is Error(kCorrupt) naming its chunk, and the tensors still alias
// the mapping (no copy was made to check them).
TEST(Map, VerifyChecksEveryChunkInTheMapping) {
  testing::TempDir dir;
  Fixture f;
  for (int i = 0; i < 4; ++i) f.AddContiguous("w" + std::to_string(i), DType::kFloat32, {100, 100 + i}, 10 + i);
  std::string path = f.WriteIn(dir, "v.zckpt", SmallChunks(4096));
  MapOptions verify;
  verify.verify = true;
  verify.threads = 3;
  MapResult good = Map(path, verify);
  EXPECT_EQ(good.stats.verified_bytes, good.stats.mapped_bytes);
  auto ranges = MappingsOf(path);
  for (const auto& [key, b] : good.storages_by_key) {
    EXPECT_TRUE(Inside(b.data_ptr(), ranges)) << key;
    EXPECT_TRUE(testing::BytesOf(b) == f.bytes(key)) << key;
  }
  EXPECT_EQ(Map(path).stats.verified_bytes, 0u);

  auto c = Container::Open(path);
  for (uint32_t s : {0u, 3u}) {  // first and last storage: every thread's share is checked
    StorageInfo info = c->storage(s);
    uint64_t chunk = info.first_chunk + info.chunk_count - 1;
    format::ChunkRecord r = c->chunk(chunk);
    testing::FlipBit(path, r.offset + r.stored_bytes - 1);
    try {
      Map(path, verify);
      FAIL() << "mapped a corrupt file";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(chunk) + ","), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(Map(path));  // unchecked, it maps
    testing::FlipBit(path, r.offset + r.stored_bytes - 1);
  }
  EXPECT_NO_THROW(Map(path, verify));
}

// verify reads the file's mapping, which another process may truncate at any moment: a chunk
// whose pages are gone ends the check with Error(kIo) naming the file (the SIGBUS guard), with
// one thread and with several, never a SIGBUS.
TEST(Map, VerifyOfAFileTruncatedAfterOpenIsAnIoError) {
  for (unsigned threads : {1u, 3u}) {
    SCOPED_TRACE(threads);
    testing::TempDir dir;
    Fixture f;
    for (int i = 0; i < 4; ++i) f.AddContiguous("w" + std::to_string(i), DType::kFloat32, {64, 256}, 20 + i);
    std::string path = f.WriteIn(dir, "t.zckpt", SmallChunks(16 << 10));
    auto c = Container::Open(path);
    std::vector<uint64_t> chunks;
    for (uint64_t i = 0; i < c->chunk_count(); ++i) chunks.push_back(i);
    loader::VerifyMapped(*c, ContainerFile::Data(*c), chunks, threads);  // whole: no error
    const uint64_t cut = c->chunk(chunks.size() / 2).offset + 100;  // inside a chunk halfway through
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(cut)), 0);
    try {
      loader::VerifyMapped(*c, ContainerFile::Data(*c), chunks, threads);
      FAIL() << "checked a chunk whose bytes are gone";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
      EXPECT_NE(std::string(e.what()).find(path + ": the file changed size"), std::string::npos) << e.what();
    }
  }
}

// Map(verify) while another thread truncates the file and writes it back, again and again: each
// Map returns or throws an error (never a SIGBUS), and some of them meet the truncation while
// checking. (The tensors of a Map that returned are not touched: the file may be short again.)
TEST(Map, VerifyRacingTruncationReturnsOrFails) {
  testing::TempDir dir;
  Fixture f;
  for (int i = 0; i < 4; ++i) f.AddContiguous("w" + std::to_string(i), DType::kFloat32, {256, 1024}, 30 + i);
  std::string path = f.WriteIn(dir, "r.zckpt", SmallChunks(64 << 10));
  const std::vector<uint8_t> original = testing::ReadFileBytes(path);
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  std::atomic<bool> stop{false};
  std::thread changer([&] {
    std::mt19937_64 rng(5);
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      (void)!::ftruncate(fd, static_cast<off_t>(4096 + rng() % (original.size() - 8192)));
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      (void)!::pwrite(fd, original.data(), original.size(), 0);
    }
  });
  MapOptions verify;
  verify.verify = true;
  verify.threads = 2;
  int ok = 0, shrank = 0, other = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (int n = 0; n < 50 || std::chrono::steady_clock::now() < end; ++n) {
    try {
      (void)Map(path, verify);
      ++ok;
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_TRUE(e.kind() == ErrorKind::kIo || e.kind() == ErrorKind::kCorrupt || e.kind() == ErrorKind::kNotContainer) << m;
      if (e.kind() == ErrorKind::kIo && m.find("(checking ") != std::string::npos) ++shrank;
      else ++other;
    }
  }
  stop = true;
  changer.join();
  ::close(fd);
  std::printf("map verify race: %d maps complete, %d met a shrunk file while checking, %d other errors\n", ok, shrank, other);
  EXPECT_GT(shrank, 0) << "no check met the truncation: the race did not happen";
}

TEST(Map, ReadsNoDataOfALargeFile) {
  testing::TempDir dir;
  std::string path = dir.File("large.zckpt");
  const int64_t rows = 16, cols = 4 << 20;  // 16 tensors of 16 MiB: 256 MiB
  {
    ContainerWriter w(path);
    std::vector<uint8_t> block = testing::RandomBytes(size_t{1} << 20, 9);
    for (int i = 0; i < rows; ++i) {
      NewStorage s;
      s.key = std::to_string(i);
      s.dtype = DType::kFloat32;
      w.BeginStorage(s, static_cast<uint64_t>(cols) * 4);
      for (int k = 0; k < 16; ++k) w.AppendStorage(block);
      w.EndStorage();
      w.AddTensor(NewTensor{std::string("t").append(std::to_string(i)), static_cast<uint32_t>(i), DType::kFloat32, {cols}, {1}, 0, 0, ""});
    }
    w.Commit();
  }
  HostMemory before = ReadHostMemory();
  MapResult m = Map(path);
  HostMemory after = ReadHostMemory();
  EXPECT_EQ(m.stats.mapped_bytes, 256u << 20);
  EXPECT_LT(after.rss, before.rss + (16u << 20)) << "Map read data: RSS grew from " << before.rss << " to " << after.rss;
  // Touching one element brings in one page, not the tensor.
  float x = m.get("t7")[123456].item<float>();
  (void)x;
  EXPECT_LT(ReadHostMemory().rss, before.rss + (16u << 20));
}

}  // namespace
}  // namespace zckpt
