// Writer -> reader round trips: every dtype, storage sizes around chunk boundaries with and
// without zstd, thousands of storages, views, blobs, metadata, and pieces of any size.
#include <gtest/gtest.h>

#include <cstring>

#include "common/mapped_file.h"
#include "format/container_file.h"
#include "format_test_util.h"
#include "test_util.h"

namespace zckpt::testing {

using format::internal::ContainerFile;
namespace {

// The raw bytes of a contiguous storage (every chunk codec 0) as mapped, or empty.
std::span<const uint8_t> MappedStorage(const Container& c, uint32_t s) {
  StorageInfo info = c.storage(s);
  if (!info.contiguous || info.raw_bytes == 0) return {};
  return {ContainerFile::Data(c) + info.data_offset, info.raw_bytes};
}

std::unique_ptr<Container> Open(const std::vector<uint8_t>& bytes) {
  return Container::OpenMemory(bytes.data(), bytes.size(), "mem.zckpt");
}

void ExpectVerifies(const Container& c) {
  VerifyReport r = c.Verify();
  for (const auto& p : r.problems) ADD_FAILURE() << p.message;
  EXPECT_EQ(r.bytes_checked, c.file_bytes());
  EXPECT_EQ(r.chunks_checked, c.chunk_count());
}

TEST(RoundTrip, EveryDType) {
  std::vector<std::vector<uint8_t>> data;
  auto bytes = BuildContainer([&](ContainerWriter& w) {
    for (uint16_t code = 1; code <= kMaxDTypeCode; ++code) {
      DType dt = static_cast<DType>(code);
      data.push_back(RandomBytes(DTypeSize(dt) * 3, code));
      uint32_t s = w.AddStorage({"s" + std::to_string(code), "cpu", dt}, data.back());
      w.AddTensor(Tensor(std::string(DTypeName(dt)), s, dt, {3}, {1}));
    }
  });
  auto c = Open(bytes);
  ASSERT_EQ(c->storage_count(), kMaxDTypeCode);
  ASSERT_EQ(c->tensor_count(), kMaxDTypeCode);
  for (uint16_t code = 1; code <= kMaxDTypeCode; ++code) {
    DType dt = static_cast<DType>(code);
    auto t = c->FindTensor(DTypeName(dt));
    ASSERT_TRUE(t.has_value()) << DTypeName(dt);
    TensorInfo info = c->tensor(*t);
    EXPECT_EQ(info.dtype, dt);
    EXPECT_EQ(info.byte_end, 3u * DTypeSize(dt));
    EXPECT_EQ(c->storage(info.storage).dtype, dt);
    EXPECT_EQ(ReadStorage(*c, info.storage), data[code - 1]);
  }
  ExpectVerifies(*c);
}

struct SizeCase {
  uint64_t bytes;
  bool zstd;
  bool random;
};

class SizeEdges : public ::testing::TestWithParam<SizeCase> {};

TEST_P(SizeEdges, RoundTrip) {
  const SizeCase sc = GetParam();
  WriterOptions o;
  o.chunk_bytes = 4096;
  o.large_threshold = 4096;
  o.zstd_level = sc.zstd ? 3 : 0;
  o.threads = 3;
  std::vector<uint8_t> data = sc.random ? RandomBytes(sc.bytes, sc.bytes) : PatternBytes(sc.bytes);
  WriterStats stats;
  TempDir dir;
  {
    ContainerWriter w(dir.File("x.zckpt"), o);
    w.AddStorage({"before", "cpu", DType::kUInt8}, RandomBytes(100, 7));  // leaves the file unaligned
    w.AddStorage({"x", "cpu", DType::kUInt8}, data);
    stats = w.Commit();
  }
  auto bytes = ReadFileBytes(dir.File("x.zckpt"));
  EXPECT_EQ(stats.file_bytes, bytes.size());
  auto c = Open(bytes);
  StorageInfo s = c->storage(1);
  EXPECT_EQ(s.raw_bytes, sc.bytes);
  EXPECT_EQ(s.chunk_count, (sc.bytes + 4095) / 4096);
  EXPECT_EQ(stats.chunks, 1 + s.chunk_count);
  EXPECT_EQ(ReadStorage(*c, 1), data);
  EXPECT_EQ(s.alignment, sc.bytes >= 4096 ? 4096u : 64u);
  uint64_t compressed = 0, compressible = 0;
  for (uint64_t k = 0; k < s.chunk_count; ++k) {
    format::ChunkRecord ch = c->chunk(s.first_chunk + k);
    EXPECT_EQ(ch.offset % s.alignment, 0u);
    EXPECT_EQ(ch.storage, 1u);
    compressed += ch.codec == 1;
    compressible += ch.raw_bytes >= 64;
    if (ch.codec == 1) {
      EXPECT_LT(ch.stored_bytes, ch.raw_bytes);
    }
  }
  if (!sc.zstd || sc.random) {
    EXPECT_EQ(compressed, 0u);  // random data falls back to raw
    EXPECT_TRUE(s.contiguous);
    auto view = MappedStorage(*c, 1);
    ASSERT_EQ(view.size(), data.size());
    if (!data.empty()) {
      EXPECT_EQ(0, std::memcmp(view.data(), data.data(), data.size()));
    }
  } else if (sc.bytes >= 64) {
    EXPECT_EQ(compressed, compressible);  // patterns must compress (a 1-byte tail cannot)
    EXPECT_FALSE(s.contiguous);
    EXPECT_TRUE(MappedStorage(*c, 1).empty());
    EXPECT_LT(stats.stored_bytes, stats.raw_bytes);
  }
  EXPECT_EQ(stats.compressed_chunks, compressed);
  ExpectVerifies(*c);
}

INSTANTIATE_TEST_SUITE_P(Format, SizeEdges,
                         ::testing::ValuesIn(std::vector<SizeCase>{
                             {0, false, true}, {1, false, true}, {4095, false, true}, {4096, false, true},
                             {4097, false, true}, {5 * 4096 + 3, false, true}, {0, true, false},
                             {1, true, false}, {4096, true, false}, {4097, true, false},
                             {9 * 4096 + 100, true, false}, {4096, true, true}, {4097, true, true},
                             {7 * 4096, true, true}}));

TEST(RoundTrip, FiveThousandTinyStorages) {
  constexpr uint32_t kN = 5000;
  auto bytes = BuildContainer([](ContainerWriter& w) {
    for (uint32_t i = 0; i < kN; ++i) {
      uint32_t n = 1 + i % 16;
      uint32_t s = w.AddStorage({std::to_string(i), "cpu", DType::kUInt8}, RandomBytes(n, i));
      w.AddTensor(Tensor("layer." + std::to_string(i) + ".w", s, DType::kUInt8, {n}, {1}));
    }
  });
  // Small storages share 64-byte alignment: no 4 KiB per tensor.
  EXPECT_LT(bytes.size(), kN * (64 + 64 + 64 + 48 + 32));
  auto c = Open(bytes);
  ASSERT_EQ(c->storage_count(), kN);
  for (uint32_t i : {0u, 1u, 2500u, 4999u}) {
    auto s = c->FindStorage(std::to_string(i));
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(*s, i);
    EXPECT_EQ(ReadStorage(*c, i), RandomBytes(1 + i % 16, i));
    EXPECT_EQ(c->chunk(i).offset % 64, 0u);
    auto t = c->FindTensor("layer." + std::to_string(i) + ".w");
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(c->TensorsOfStorage(i), std::vector<uint32_t>{*t});
  }
  EXPECT_FALSE(c->FindStorage("5000").has_value());
  ExpectVerifies(*c);
}

TEST(RoundTrip, ViewsStridesOffsetsAndEmptyTensors) {
  auto c_bytes = SmallContainer();
  auto c = Open(c_bytes);
  ASSERT_EQ(c->tensor_count(), 6u);
  TensorInfo w = c->tensor(*c->FindTensor("w"));
  EXPECT_EQ(w.shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(w.stride, (std::vector<int64_t>{32, 1}));
  EXPECT_EQ(w.byte_begin, 0u);
  EXPECT_EQ(w.byte_end, 4096u);
  TensorInfo wt = c->tensor(*c->FindTensor("w.T"));
  EXPECT_EQ(wt.stride, (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(wt.storage, w.storage);
  EXPECT_EQ(wt.flags, format::kTensorParameter);
  TensorInfo odd = c->tensor(*c->FindTensor("odd"));
  EXPECT_EQ(odd.storage_offset, 3u);
  EXPECT_EQ(odd.byte_begin, 3u);
  EXPECT_EQ(odd.byte_end, 12u);
  EXPECT_EQ(odd.extra, "{\"k\":1}");
  TensorInfo empty = c->tensor(*c->FindTensor("empty"));
  EXPECT_EQ(empty.shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(empty.byte_begin, empty.byte_end);
  EXPECT_EQ(c->storage(empty.storage).raw_bytes, 0u);
  EXPECT_EQ(c->storage(empty.storage).chunk_count, 0u);
  EXPECT_TRUE(MappedStorage(*c, empty.storage).empty());
  TensorInfo scalar = c->tensor(*c->FindTensor("scalar"));
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.byte_begin, 16u);
  EXPECT_EQ(scalar.byte_end, 24u);
  EXPECT_EQ(c->TensorsOfStorage(0), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(c->TensorsOfStorage(1), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(c->storage(1).location, "cuda:0");
  EXPECT_FALSE(c->FindTensor("nope").has_value());
  EXPECT_FALSE(c->FindTensor("").has_value());
  ExpectVerifies(*c);
}

TEST(RoundTrip, BlobsAndMetadata) {
  auto pickle = RandomBytes(1000, 3), other = PatternBytes(70);
  auto bytes = BuildContainer([&](ContainerWriter& w) {
    w.AddBlob("data.pkl", pickle);
    w.AddStorage({"0", "cpu", DType::kFloat32}, RandomBytes(4096 * 20, 1));
    w.AddBlob("empty", {});
    w.AddBlob("version", other);
    w.SetMetadata("zckpt.source.name", "model.pt");
    w.SetMetadata("user", "");
    w.SetMetadata("", "empty key");
  });
  auto c = Open(bytes);
  ASSERT_EQ(c->blob_count(), 3u);
  auto b = c->FindBlob("data.pkl");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(c->CheckedBlobBytes(*b), pickle);
  EXPECT_EQ(b->offset % 64, 0u);
  auto e = c->FindBlob("empty");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->bytes, 0u);
  EXPECT_EQ(e->offset, 0u);
  EXPECT_TRUE(c->CheckedBlobBytes(*e).empty());
  EXPECT_EQ(c->CheckedBlobBytes(*c->FindBlob("version")), other);
  EXPECT_FALSE(c->FindBlob("missing").has_value());
  ASSERT_EQ(c->metadata_count(), 3u);
  EXPECT_EQ(c->metadata(0).first, "zckpt.source.name");
  EXPECT_EQ(c->FindMetadata("zckpt.source.name"), "model.pt");
  EXPECT_EQ(c->FindMetadata("user"), "");
  EXPECT_EQ(c->FindMetadata(""), "empty key");
  EXPECT_FALSE(c->FindMetadata("other").has_value());
  ExpectVerifies(*c);
}

// Pieces of any size re-chunk into the same file as one AddStorage call (which, over 1 MiB,
// hashes and writes the caller's bytes in place instead of copying them), whatever the number of
// threads: the writer's output is deterministic.
TEST(RoundTrip, PiecesOfOddSizesGiveTheSameFile) {
  auto data = PatternBytes(300 * 4096 + 77);
  auto noise = RandomBytes(data.size(), 5);
  for (size_t i = 0; i < data.size(); i += 3) data[i] = noise[i];  // compressible, but not trivially
  auto build = [&](unsigned threads, bool pieces) {
    WriterOptions o;
    o.chunk_bytes = 4096;
    o.zstd_level = 1;
    o.threads = threads;
    return BuildContainer(
        [&](ContainerWriter& w) {
          if (!pieces) {
            w.AddStorage({"a", "cpu", DType::kUInt8}, data);
          } else {
            w.BeginStorage({"a", "cpu", DType::kUInt8}, data.size());
            size_t sizes[] = {1, 7, 4095, 4097, 13, 8192, 0, 65536 + 3};
            size_t at = 0;
            for (size_t k = 0; at < data.size(); ++k) {
              size_t n = std::min(sizes[k % 8], data.size() - at);
              w.AppendStorage(std::span<const uint8_t>(data).subspan(at, n));
              at += n;
            }
            w.EndStorage();
          }
          w.AddTensor(Tensor("t", 0, DType::kUInt8, {static_cast<int64_t>(data.size())}, {1}));
        },
        o);
  };
  auto reference = build(1, false);
  EXPECT_EQ(build(1, true), reference);
  EXPECT_EQ(build(4, true), reference);
  EXPECT_EQ(build(8, false), reference);
  auto c = Open(reference);
  EXPECT_EQ(ReadStorage(*c, 0), data);
  ExpectVerifies(*c);
}

TEST(RoundTrip, LargeStoragesAreBlockAlignedAndContiguous) {
  auto big = RandomBytes(3 * (1 << 16) + 10, 9);
  auto bytes = BuildContainer([&](ContainerWriter& w) {
    w.AddStorage({"small", "cpu", DType::kUInt8}, RandomBytes(10, 1));
    w.AddStorage({"big", "cpu", DType::kUInt8}, big);
  });
  auto c = Open(bytes);
  StorageInfo s = c->storage(1);
  EXPECT_EQ(s.alignment, 4096u);
  EXPECT_EQ(s.data_offset % 4096, 0u);
  EXPECT_TRUE(s.contiguous);
  auto view = MappedStorage(*c, 1);
  EXPECT_EQ(std::vector<uint8_t>(view.begin(), view.end()), big);
  EXPECT_EQ(c->superblock().chunk_bytes, format::kDefaultChunkBytes);
  ExpectVerifies(*c);
}

TEST(RoundTrip, OpenFromPathAndStringDeduplication) {
  TempDir dir;
  std::string path = dir.File("m.zckpt");
  {
    ContainerWriter w(path);
    for (int i = 0; i < 100; ++i) w.AddStorage({"k" + std::to_string(i), "cuda:0", DType::kUInt8}, {});
    w.SetMetadata("cuda:0", "k1");
    w.Commit();
  }
  auto c = Container::Open(path);
  EXPECT_EQ(c->path(), path);
  EXPECT_EQ(c->file_bytes(), ReadFileBytes(path).size());
  EXPECT_EQ(ContainerFile::Of(*c).size(), c->file_bytes());
  EXPECT_EQ(c->storage(3).location, "cuda:0");
  // "cuda:0" once, keys k0..k99 once: 6 + 10 * 2 + 90 * 3 bytes.
  format::TableDescriptor strings =
      format::DecodeTableDescriptor(ContainerFile::Data(*c) + c->footer().index_offset + 16 + 32 * 6);
  EXPECT_EQ(strings.count, 6u + 20 + 270);
  ExpectVerifies(*c);
}

TEST(RoundTrip, EmptyContainer) {
  auto bytes = BuildContainer([](ContainerWriter&) {});
  EXPECT_EQ(bytes.size(), 384u);  // superblock, 240-byte index, padding, footer
  auto c = Open(bytes);
  EXPECT_EQ(c->storage_count(), 0u);
  EXPECT_EQ(c->chunk_count(), 0u);
  ExpectVerifies(*c);
}

}  // namespace
}  // namespace zckpt::testing
