// Verify (spec §7 "Verification") and ReadChunk on damaged data: every bad chunk reported with
// its storage, tensors and byte range, whatever the thread count; bad zstd frames; blobs;
// padding; progress, cancellation, and pages released behind the scan.
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <fstream>

#include "format/bytes.h"
#include "format/chunk_check.h"
#include "format/chunk_codec.h"
#include "format_test_util.h"
#include "test_util.h"

namespace zckpt::testing {
namespace {

using format::TableId;
using format::internal::Load64;

// Storage "emb": 10 raw chunks viewed by emb.weight and tied.weight; storage "w": 5 zstd chunks
// (chunk indices 10..14); a blob.
std::vector<uint8_t> MultiChunk() {
  WriterOptions o;
  o.chunk_bytes = 4096;
  o.zstd_level = 3;
  o.threads = 2;
  return BuildContainer(
      [](ContainerWriter& w) {
        w.AddStorage({"emb", "cpu", DType::kFloat32}, RandomBytes(10 * 4096, 1));
        w.AddStorage({"w", "cpu", DType::kFloat32}, PatternBytes(5 * 4096 - 8));
        w.AddTensor(Tensor("emb.weight", 0, DType::kFloat32, {10, 1024}, {1024, 1}));
        w.AddTensor(Tensor("tied.weight", 0, DType::kFloat32, {10, 1024}, {1024, 1}));
        w.AddTensor(Tensor("w", 1, DType::kFloat32, {5 * 1024 - 2}, {1}));
        w.AddBlob("data.pkl", RandomBytes(300, 2));
      },
      o);
}

std::vector<VerifyProblem> Problems(const std::vector<uint8_t>& bytes, unsigned threads) {
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m.zckpt");
  VerifyOptions o;
  o.threads = threads;
  VerifyReport r = c->Verify(o);
  EXPECT_EQ(r.bytes_checked, bytes.size());
  return r.problems;
}

uint64_t ChunkOffset(const std::vector<uint8_t>& bytes, uint64_t i) {
  return Container::OpenMemory(bytes.data(), bytes.size(), "m")->chunk(i).offset;
}

TEST(Verify, CleanFileHasNoProblems) {
  auto bytes = MultiChunk();
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m.zckpt");
  ASSERT_EQ(c->chunk_count(), 15u);
  EXPECT_EQ(c->chunk(10).codec, 1);
  for (std::optional<unsigned> t : {std::optional<unsigned>(), std::optional<unsigned>(1u), std::optional<unsigned>(2u),
                                    std::optional<unsigned>(3u), std::optional<unsigned>(8u), std::optional<unsigned>(64u)}) {
    VerifyOptions o;
    o.threads = t;  // unset: the hardware threads
    VerifyReport r = c->Verify(o);
    EXPECT_TRUE(r.ok()) << t.value_or(0);
    EXPECT_EQ(r.chunks_checked, 15u);
    EXPECT_EQ(r.bytes_checked, bytes.size());
  }
  VerifyOptions zero;  // 0 is the default, as unset (and as a load's threads)
  zero.threads = 0u;
  VerifyReport r = c->Verify(zero);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.chunks_checked, 15u);
}

TEST(Verify, OneCorruptChunkIsNamedExactly) {
  auto bytes = MultiChunk();
  uint64_t at = ChunkOffset(bytes, 3);
  bytes[at + 100] ^= 0x40;
  for (unsigned threads : {1u, 2u, 4u, 8u}) {
    auto problems = Problems(bytes, threads);
    ASSERT_EQ(problems.size(), 1u) << threads;
    const std::string& m = problems[0].message;
    EXPECT_EQ(problems[0].place.chunk, 3);
    EXPECT_EQ(m.rfind("m.zckpt: storage 'emb' (tensors emb.weight, tied.weight), chunk 3, file bytes [" +
                          std::to_string(at) + ", " + std::to_string(at + 4096) +
                          "), storage bytes [12288, 16384): stored checksum mismatch",
                      0),
              0u)
        << m;
  }
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m.zckpt");
  std::vector<uint8_t> buf(4096);
  try {
    c->ReadChunk(3, buf.data());
    ADD_FAILURE() << "ReadChunk of a corrupt chunk succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("chunk 3, file bytes"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(c->ReadChunk(2, buf.data()));
  EXPECT_NO_THROW(c->ReadChunk(3, buf.data(), /*check=*/false));
}

TEST(Verify, TwoCorruptChunksAreBothReported) {
  auto bytes = MultiChunk();
  bytes[ChunkOffset(bytes, 1)] ^= 1;
  bytes[ChunkOffset(bytes, 12) + 5] ^= 0x80;  // inside a zstd frame
  for (unsigned threads : {1u, 3u, 8u}) {
    auto problems = Problems(bytes, threads);
    ASSERT_EQ(problems.size(), 2u) << threads;
    EXPECT_EQ(problems[0].place.chunk, 1);
    EXPECT_EQ(problems[1].place.chunk, 12);
    EXPECT_NE(problems[1].message.find("storage 'w' (tensors w), chunk 12"), std::string::npos);
    EXPECT_NE(problems[1].message.find("storage bytes [8192, 12288)"), std::string::npos);
  }
}

TEST(Verify, EveryChunkCorruptIsEveryChunkReported) {
  auto bytes = MultiChunk();
  for (uint64_t i = 0; i < 15; ++i) bytes[ChunkOffset(bytes, i) + 2] ^= 4;
  for (unsigned threads : {1u, 4u}) {
    auto problems = Problems(bytes, threads);
    ASSERT_EQ(problems.size(), 15u);
    for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(problems[i].place.chunk, i);
  }
}

// A zstd frame damaged with its stored checksum re-forged: decoding must catch it.
TEST(Verify, BadZstdFrameBehindAValidChecksum) {
  for (int where : {0, 5, -1}) {  // frame header, middle, last byte
    Forger f(MultiChunk());
    uint8_t* rec = f.record(TableId::kChunks, 11);
    uint64_t off = Load64(rec), n = Load64(rec + 8);
    f.bytes()[off + (where < 0 ? n - 1 : where)] ^= 0x21;
    f.Set64(rec + 24, format::Checksum(f.bytes().data() + off, n));
    auto& bytes = f.Reseal();
    auto problems = Problems(bytes, 2);
    ASSERT_EQ(problems.size(), 1u) << where;
    EXPECT_EQ(problems[0].place.chunk, 11);
    auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m");
    std::vector<uint8_t> buf(4096);
    EXPECT_THROW(c->ReadChunk(11, buf.data()), Error);
  }
}

TEST(Verify, RawChecksumMismatch) {
  Forger f(MultiChunk());
  uint8_t* rec = f.record(TableId::kChunks, 13);
  f.Set64(rec + 32, Load64(rec + 32) + 1);
  auto& bytes = f.Reseal();
  auto problems = Problems(bytes, 1);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].message.find("raw checksum mismatch"), std::string::npos) << problems[0].message;
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m");
  std::vector<uint8_t> buf(4096);
  try {
    c->ReadChunk(13, buf.data());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("raw checksum mismatch"), std::string::npos);
  }
  EXPECT_NO_THROW(c->ReadChunk(13, buf.data(), false));
  auto pattern = PatternBytes(5 * 4096 - 8);
  EXPECT_EQ(buf, std::vector<uint8_t>(pattern.begin() + 3 * 4096, pattern.begin() + 4 * 4096));
}

TEST(Verify, CorruptBlob) {
  auto bytes = MultiChunk();
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m");
  uint64_t at = c->FindBlob("data.pkl")->offset;
  c.reset();
  bytes[at + 299] ^= 1;
  auto problems = Problems(bytes, 2);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].place.chunk, -1);
  EXPECT_NE(problems[0].message.find("blob 'data.pkl', file bytes [" + std::to_string(at) + ", " +
                                     std::to_string(at + 300) + "): blob checksum mismatch"),
            std::string::npos)
      << problems[0].message;
}

TEST(Verify, NonzeroPadding) {
  auto bytes = MultiChunk();
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m");
  // Zstd chunks end unaligned: the gap after chunk 10 is padding.
  auto ch = c->chunk(10);
  uint64_t gap = ch.offset + ch.stored_bytes, next = c->chunk(11).offset;
  ASSERT_LT(gap, next);
  c.reset();
  bytes[next - 1] = 0xFF;
  bytes[gap + 1] = 0x01;
  for (unsigned threads : {1u, 8u}) {
    auto problems = Problems(bytes, threads);
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_NE(problems[0].message.find("padding bytes [" + std::to_string(gap) + ", " + std::to_string(next) +
                                       ") are not zero (first nonzero byte at file offset " + std::to_string(gap + 1)),
              std::string::npos)
        << problems[0].message;
  }
}

// Every gap filled with ones: the same reports whatever the thread count (gaps split between
// threads are reported once).
TEST(Verify, EveryGapReportedOnceWithAnyThreadCount) {
  WriterOptions o;
  o.chunk_bytes = 1 << 20;
  o.large_alignment = 1 << 20;
  o.large_threshold = 1;
  auto bytes = BuildContainer(
      [](ContainerWriter& w) {
        for (int i = 0; i < 24; ++i) w.AddStorage({std::to_string(i)}, RandomBytes(700000 + i, i));
      },
      o);
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m");
  uint64_t prev = 64, gaps = 0;
  for (uint64_t i = 0; i < c->chunk_count(); ++i) {
    auto ch = c->chunk(i);
    if (ch.offset > prev) gaps++;
    for (uint64_t b = prev; b < ch.offset; ++b) bytes[b] = 1;
    prev = ch.offset + ch.stored_bytes;
  }
  for (uint64_t b = prev; b < c->footer().index_offset; ++b) bytes[b] = 1;
  gaps += prev < c->footer().index_offset;
  c.reset();
  auto one = Problems(bytes, 1);
  EXPECT_EQ(one.size(), gaps);
  for (unsigned threads : {2u, 3u, 5u, 7u}) {
    auto many = Problems(bytes, threads);
    ASSERT_EQ(many.size(), one.size()) << threads;
    for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(many[i].message, one[i].message);
  }
}

TEST(Verify, ProgressIsMonotoneAndComplete) {
  auto bytes = BuildContainer([](ContainerWriter& w) { w.AddStorage({"a"}, RandomBytes(40 << 20, 3)); });
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m");
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  VerifyOptions o;
  o.threads = 4;
  o.progress = [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); };  // serialized
  EXPECT_TRUE(c->Verify(o).ok());
  ASSERT_GE(calls.size(), 2u);
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_LE(calls[i - 1].first, calls[i].first);
  EXPECT_EQ(calls.back().first, bytes.size());
  EXPECT_EQ(calls.back().second, bytes.size());
}

TEST(Verify, Cancel) {
  auto bytes = BuildContainer([](ContainerWriter& w) { w.AddStorage({"a"}, RandomBytes(40 << 20, 3)); });
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "m");
  std::atomic<bool> cancel{false};
  uint64_t last = 0;
  VerifyOptions o;
  o.threads = 2;
  o.cancel = &cancel;
  o.progress = [&](uint64_t done, uint64_t) {
    last = done;
    cancel = true;
  };
  try {
    c->Verify(o);
    ADD_FAILURE() << "not cancelled";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCancelled);
  }
  EXPECT_LT(last, bytes.size());
}

uint64_t RssFileKiB() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    uint64_t v;
    if (key == "RssFile:" && in >> v) return v;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

// Pages are released behind the scan: verifying a mapped file does not leave it resident.
TEST(Verify, ReleasesPagesBehindTheScan) {
  TempDir dir;
  std::string path = dir.File("big.zckpt");
  {
    ContainerWriter w(path);
    w.AddStorage({"a"}, RandomBytes(96 << 20, 4));
    w.Commit();
  }
  auto c = Container::Open(path);
  uint64_t before = RssFileKiB();
  if (before == 0) GTEST_SKIP() << "no RssFile in /proc/self/status";
  ASSERT_TRUE(c->Verify().ok());
  uint64_t after = RssFileKiB();
  EXPECT_LT(after, before + 32 * 1024) << "RssFile grew from " << before << " KiB to " << after << " KiB";
  // Still readable afterwards: released pages fault back in from the file.
  std::vector<uint8_t> buf(c->chunk(3).raw_bytes);
  EXPECT_NO_THROW(c->ReadChunk(3, buf.data()));
}

TEST(Verify, DescribeChunkNamesAtMostEightTensors) {
  auto bytes = BuildContainer([](ContainerWriter& w) {
    w.AddStorage({"s", "cpu", DType::kFloat32}, RandomBytes(64, 1));
    w.AddStorage({"lonely"}, RandomBytes(3, 1));
    for (int i = 0; i < 11; ++i) w.AddTensor(Tensor("t" + std::to_string(i), 0, DType::kFloat32, {1}, {1}, uint64_t(i)));
  });
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "d.zckpt");
  EXPECT_EQ(c->DescribeChunk(0), "d.zckpt: storage 's' (tensors t0, t1, t2, t3, t4, t5, t6, t7, and 3 more), chunk 0, "
                                 "file bytes [64, 128), storage bytes [0, 64)");
  EXPECT_EQ(c->DescribeChunk(1), "d.zckpt: storage 'lonely' (no tensors), chunk 1, file bytes [128, 131), storage "
                                 "bytes [0, 3)");
}

// The codec's frame rules, on frames the writer would never produce, through the one chunk
// checker every reader calls: into a destination (loading) and through its window (verifying).
TEST(ChunkCodec, FrameRules) {
  using format::internal::ChunkChecker;
  using format::internal::ChunkFault;
  using Kind = ChunkFault::Kind;
  auto raw = PatternBytes(5000);
  std::vector<uint8_t> frame(ZSTD_compressBound(raw.size()));
  frame.resize(ZSTD_compress(frame.data(), frame.size(), raw.data(), raw.size(), 3));
  const uint64_t sum = format::Checksum(raw.data(), raw.size());
  auto record = [&](const std::vector<uint8_t>& f, uint64_t raw_bytes, uint64_t raw_checksum) {
    format::ChunkRecord r;
    r.stored_bytes = f.size();
    r.raw_bytes = raw_bytes;
    r.stored_checksum = format::Checksum(f.data(), f.size());
    r.raw_checksum = raw_checksum;
    r.codec = static_cast<uint8_t>(format::Codec::kZstd);
    return r;
  };
  ChunkChecker check;
  std::vector<uint8_t> out(raw.size());
  auto decode = [&](const std::vector<uint8_t>& f, uint64_t raw_bytes) {
    return check.Check(record(f, raw_bytes, sum), f.data(), out.data());
  };
  EXPECT_FALSE(decode(frame, out.size()));
  EXPECT_EQ(out, raw);
  auto bad = decode(frame, out.size() - 1);  // declared size differs
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->kind, Kind::kFrame);
  auto trailing = frame;
  trailing.push_back(0);
  EXPECT_TRUE(decode(trailing, out.size()));
  EXPECT_TRUE(decode(std::vector<uint8_t>(frame.begin(), frame.end() - 1), out.size()));
  // The stored checksum is judged first: it explains whatever else is wrong.
  format::ChunkRecord flipped = record(frame, raw.size(), sum);
  flipped.stored_checksum ^= 1;
  bad = check.Check(flipped, frame.data(), out.data());
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->kind, Kind::kStoredChecksum);
  EXPECT_EQ(bad->expected, flipped.stored_checksum);
  EXPECT_NE(bad->Describe().find("stored checksum mismatch"), std::string::npos);
  // Decoded into a destination, the raw checksum is taken there.
  bad = check.Check(record(frame, raw.size(), sum + 1), frame.data(), out.data());
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->kind, Kind::kRawChecksum);
  EXPECT_EQ(bad->got, sum);

  // Without a content size in the header.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  std::vector<uint8_t> nosize(ZSTD_compressBound(raw.size()));
  ZSTD_outBuffer ob = {nosize.data(), nosize.size(), 0};
  ZSTD_inBuffer ib = {raw.data(), raw.size(), 0};
  ASSERT_EQ(ZSTD_compressStream2(cctx, &ob, &ib, ZSTD_e_end), 0u);
  ZSTD_freeCCtx(cctx);
  nosize.resize(ob.pos);
  bad = decode(nosize, out.size());
  ASSERT_TRUE(bad);
  EXPECT_NE(bad->Describe().find("content size"), std::string::npos);

  // Through the window, fed in pieces of any size.
  auto run = [&](const std::vector<uint8_t>& f, uint64_t raw_bytes, uint64_t checksum, size_t piece) {
    check.Begin(record(f, raw_bytes, checksum));
    for (size_t at = 0; at < f.size(); at += piece) check.Feed(f.data() + at, std::min(piece, f.size() - at));
    return check.Finish();
  };
  auto describe = [](const std::optional<ChunkFault>& f) { return f ? f->Describe() : std::string(); };
  for (size_t piece : {1, 7, 100000}) {
    EXPECT_FALSE(run(frame, raw.size(), sum, piece)) << piece;
    EXPECT_NE(describe(run(frame, raw.size(), sum + 1, piece)).find("raw checksum"), std::string::npos);
    EXPECT_NE(describe(run(trailing, raw.size(), sum, piece)).find("after the end"), std::string::npos);
    EXPECT_TRUE(run(std::vector<uint8_t>(frame.begin(), frame.end() - 1), raw.size(), sum, piece));
    EXPECT_NE(describe(run(nosize, raw.size(), sum, piece)).find("content size"), std::string::npos);
  }
  // Compression that does not pay is refused, so the caller stores raw.
  std::vector<uint8_t> packed;
  auto noise = RandomBytes(4096, 1);
  EXPECT_FALSE(format::internal::CompressChunk(noise.data(), noise.size(), 3, &packed));
  EXPECT_TRUE(format::internal::CompressChunk(raw.data(), raw.size(), 3, &packed));
  EXPECT_LT(packed.size(), raw.size());
}

}  // namespace
}  // namespace zckpt::testing
