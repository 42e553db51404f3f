// Hostile containers built with the test builder (container_model.h): any record, string or data
// byte edited and every checksum recomputed, so only the rule under test can refuse the file.
// The builder itself (every table editable, the result passing the checksum layer), then the
// zstd classes of issue 11: declared sizes capped before any allocation, a frame that claims
// more than its chunk, and a valid frame with a large window that verify and load must both accept.
#include <gtest/gtest.h>

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader (the frame's window size)
#include <zstd.h>

#include <cstring>

#include "container_model.h"
#include "format/bytes.h"
#include "format/chunk_codec.h"
#include "format_test_util.h"

namespace zckpt::testing {
namespace {

using format::Codec;
using format::internal::Store64;

std::unique_ptr<Container> Open(const std::vector<uint8_t>& bytes) {
  return Container::OpenMemory(bytes.data(), bytes.size(), "mem.zckpt");
}

// --- the builder ---

TEST(Builder, ParseThenBuildGivesAnEquivalentValidFile) {
  std::vector<uint8_t> original = SmallContainer();
  std::vector<uint8_t> rebuilt = ContainerModel::Parse(original).Build();
  OpenResult r = OpenAndVerify(rebuilt, 2);
  ASSERT_TRUE(r.opened) << r.message;
  EXPECT_TRUE(r.report.ok());
  auto a = Open(original), b = Open(rebuilt);
  ASSERT_EQ(a->tensor_count(), b->tensor_count());
  for (uint32_t t = 0; t < a->tensor_count(); ++t) {
    EXPECT_EQ(a->tensor(t).name, b->tensor(t).name);
    EXPECT_EQ(a->tensor(t).shape, b->tensor(t).shape);
    EXPECT_EQ(a->tensor(t).byte_end, b->tensor(t).byte_end);
  }
  for (uint32_t s = 0; s < a->storage_count(); ++s) EXPECT_EQ(ReadStorage(*a, s), ReadStorage(*b, s));
  EXPECT_EQ(a->CheckedBlobBytes(a->blob(0)), b->CheckedBlobBytes(b->blob(0)));
}

// Every table, the string pool and the data bytes are editable, and the result passes every
// checksum (the edits below keep the structural rules too, so the file is simply valid).
TEST(Builder, EditsAnyRecordAndReseals) {
  ContainerModel m = ContainerModel::Parse(SmallContainer());
  m.storages[1].location = m.AddString("cuda:7");                                  // storage + string
  std::vector<uint8_t> fresh = RandomBytes(200, 99);
  m.chunk_data[1] = fresh;                                                         // raw chunk bytes
  m.tensors[2].name = m.AddString("renamed");                                      // tensor
  m.dims[m.tensors[2].dims] = 20;                                                  // dims: [10, 20] -> [20, 10]
  m.dims[m.tensors[2].dims + 1] = 10;
  m.dims[m.tensors[2].dims + 2] = 10;
  m.blob_data[0] = std::vector<uint8_t>(1000, 0x80);                               // blob (new size)
  m.metadata[0].value = m.AddString("legacy");                                     // metadata
  m.superblock.large_threshold = 1 << 20;                                          // superblock
  std::vector<uint8_t> file = m.Build();
  OpenResult r = OpenAndVerify(file, 2);
  ASSERT_TRUE(r.opened) << r.message;
  EXPECT_TRUE(r.report.ok()) << r.report.problems[0].message;
  auto c = Open(file);
  EXPECT_EQ(c->storage(1).location, "cuda:7");
  EXPECT_EQ(ReadStorage(*c, 1), fresh);
  TensorInfo t = c->tensor(*c->FindTensor("renamed"));
  EXPECT_EQ(t.shape, (std::vector<int64_t>{20, 10}));
  EXPECT_EQ(c->CheckedBlobBytes(c->blob(0)).size(), 1000u);
  EXPECT_EQ(c->metadata(0).second, "legacy");
  EXPECT_EQ(c->superblock().large_threshold, 1u << 20);
}

TEST(Builder, AfterLayoutForgesWhatLayoutAndChecksumsSet) {
  ContainerModel m = ContainerModel::Parse(SmallContainer());
  ContainerModel::BuildOptions o;
  o.after_layout = [](ContainerModel& mm) {  // a raw chunk: both checksums, or open refuses it
    mm.chunks[1].stored_checksum ^= 1;
    mm.chunks[1].raw_checksum ^= 1;
  };
  OpenResult r = OpenAndVerify(m.Build(o));
  ASSERT_TRUE(r.opened) << r.message;
  ASSERT_EQ(r.report.problems.size(), 1u);
  EXPECT_NE(r.report.problems[0].message.find("stored checksum mismatch"), std::string::npos);
}

// --- declared sizes are capped before anything is allocated ---

// A zstd frame made by hand: header declaring `content` bytes (single segment: the window is the
// content size), then RLE blocks of `block` bytes each (4 bytes a block: a tiny frame can claim
// gigabytes), the last one marked last.
std::vector<uint8_t> RleFrame(uint64_t content, uint32_t block, uint32_t blocks) {
  std::vector<uint8_t> f = {0x28, 0xB5, 0x2F, 0xFD, 0xE0};  // magic; FCS 8 bytes, single segment
  f.resize(f.size() + 8);
  Store64(f.data() + 5, content);
  for (uint32_t i = 0; i < blocks; ++i) {
    uint32_t header = (block << 3) | (1u << 1) | (i + 1 == blocks ? 1u : 0u);  // size | RLE | last
    f.push_back(static_cast<uint8_t>(header));
    f.push_back(static_cast<uint8_t>(header >> 8));
    f.push_back(static_cast<uint8_t>(header >> 16));
    f.push_back(0);  // the repeated byte
  }
  return f;
}

// A chunk of 4096 raw bytes whose 291-KiB-sized frame header says 8 GiB: corrupt at verify and at
// read, refused from the header before any buffer is sized by it.
TEST(HostileZstd, FrameDeclaringMoreThanItsChunkIsCorrupt) {
  ContainerModel m = ContainerModel::Parse(SmallContainer());
  ASSERT_EQ(m.chunks[0].codec, uint8_t(Codec::kZstd));
  std::vector<uint8_t> bomb = RleFrame(8ull << 30, 128 << 10, 2);
  m.SetChunkData(0, bomb, Codec::kZstd, 4096);
  ContainerModel::BuildOptions o;
  o.after_layout = [](ContainerModel& mm) { mm.chunks[0].raw_checksum = 1; };
  std::vector<uint8_t> file = m.Build(o);
  OpenResult r = OpenAndVerify(file, 2);
  ASSERT_TRUE(r.opened) << r.message;
  ASSERT_EQ(r.report.problems.size(), 1u);
  EXPECT_NE(r.report.problems[0].message.find("zstd frame declares 8589934592 bytes, chunk has 4096"), std::string::npos)
      << r.report.problems[0].message;
  auto c = Open(file);
  std::vector<uint8_t> out(4096 + 64, 0xEE);
  try {
    c->ReadChunk(0, out.data(), /*check=*/false);  // the header rule holds even unchecked
    ADD_FAILURE() << "read a frame declaring 8 GiB into a 4 KiB chunk";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("declares 8589934592 bytes"), std::string::npos) << e.what();
  }
  for (size_t i = 4096; i < out.size(); ++i) ASSERT_EQ(out[i], 0xEE) << "written past the chunk at " << i;
}

// The frame's header is honest (4096) but its blocks produce more: the decoder stops at the
// chunk's end (it writes into exactly raw_bytes), and the chunk is corrupt.
TEST(HostileZstd, FrameProducingMoreThanItDeclaresIsCorrupt) {
  ContainerModel m = ContainerModel::Parse(SmallContainer());
  m.SetChunkData(0, RleFrame(4096, 4096, 16), Codec::kZstd, 4096);
  std::vector<uint8_t> file = m.Build();
  OpenResult r = OpenAndVerify(file, 1);
  ASSERT_TRUE(r.opened) << r.message;
  ASSERT_EQ(r.report.problems.size(), 1u);
  auto c = Open(file);
  std::vector<uint8_t> out(4096 + 64, 0xEE);
  EXPECT_THROW(c->ReadChunk(0, out.data(), false), Error);
  for (size_t i = 4096; i < out.size(); ++i) ASSERT_EQ(out[i], 0xEE) << "written past the chunk at " << i;
}

// The index itself cannot declare more than chunk_bytes for a chunk, nor a storage whose chunks
// do not add up: refused at open, before a loader could allocate by them.
TEST(HostileZstd, IndexDeclaringGigabytesIsRefusedAtOpen) {
  ContainerModel m = ContainerModel::Parse(SmallContainer());
  m.chunks[0].raw_bytes = 8ull << 30;
  OpenResult r = OpenAndVerify(m.Build());
  EXPECT_FALSE(r.opened);
  EXPECT_NE(r.message.find("chunk record 0: (chunk 0 of storage 0) raw_bytes 8589934592 should be 4096"),
            std::string::npos)
      << r.message;

  ContainerModel s = ContainerModel::Parse(SmallContainer());
  s.storages[0].raw_bytes = 8ull << 30;  // one 4 KiB chunk for 8 GiB
  r = OpenAndVerify(s.Build());
  EXPECT_FALSE(r.opened);
  EXPECT_NE(r.message.find("storage record 0: chunk_count 1 is not ceil(raw_bytes / chunk_bytes)"), std::string::npos)
      << r.message;
}

// A valid frame whose window (the content size, single segment) is above zstd's default streaming
// limit of 128 MiB: verify (streaming, through a window) and read (into the destination) run the
// same decoder with the same limits, so both accept it.
TEST(HostileZstd, LargeWindowFrameVerifiesAndReadsAlike) {
  const uint64_t chunk = 129ull << 20;
  ContainerModel m = ContainerModel::Parse(SmallContainer());
  m.superblock.chunk_bytes = chunk;
  std::vector<uint8_t> raw(chunk, 0);
  for (uint64_t i = 0; i < chunk; i += 4096) raw[i] = static_cast<uint8_t>(i >> 12);
  std::vector<uint8_t> frame = ZstdFrame(raw, 1, 28);
  ZSTD_frameHeader h;
  ASSERT_EQ(ZSTD_getFrameHeader(&h, frame.data(), frame.size()), 0u);
  ASSERT_GT(h.windowSize, 128ull << 20) << "the frame must need more than zstd's default window";
  // Storage 0 becomes one chunk of 129 MiB; the others keep their single small chunks.
  m.storages[0].raw_bytes = chunk;
  m.SetChunkData(0, frame, Codec::kZstd, chunk);
  std::vector<uint8_t> file = m.Build();
  OpenResult r = OpenAndVerify(file, 2);
  ASSERT_TRUE(r.opened) << r.message;
  for (const auto& p : r.report.problems) ADD_FAILURE() << p.message;
  auto c = Open(file);
  std::vector<uint8_t> out(chunk);
  c->ReadChunk(0, out.data(), true);
  EXPECT_TRUE(out == raw);
}

}  // namespace
}  // namespace zckpt::testing
