// ZipArchive against archives torch and Python's zipfile wrote: every entry must read exactly
// as zipfile reads it.
#include <gtest/gtest.h>

#include <algorithm>

#include "pt/zip_reader.h"
#include "pt_test_util.h"
#include "test_util.h"

namespace zckpt::pt {
namespace {

using testing::ExpectedEntry;
using testing::FixtureNamed;
using testing::FixturesOfKind;
using testing::MapBytes;
using testing::ReadManifest;

bool SameBytes(std::span<const uint8_t> a, const std::vector<uint8_t>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

void ExpectMatchesManifest(const std::string& path) {
  SCOPED_TRACE(path);
  std::vector<ExpectedEntry> expected = ReadManifest(path);
  ASSERT_FALSE(expected.empty());
  ZipArchive zip = ZipArchive::Open(path);
  ASSERT_EQ(zip.entries().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const ZipEntry& e = zip.entries()[i];
    const ExpectedEntry& x = expected[i];
    EXPECT_EQ(e.name, x.name);
    EXPECT_EQ(e.method, x.compress_type);
    EXPECT_EQ(e.uncompressed_size, x.size) << e.name;
    EXPECT_EQ(e.crc32, x.crc) << e.name;
    EXPECT_EQ(e.data_offset, x.data_offset) << e.name;
    EXPECT_EQ(zip.Find(x.name), &e);
    EXPECT_TRUE(SameBytes(zip.Data(e), x.bytes)) << e.name;
  }
}

TEST(ZipReaderTorchFixtures, EveryEntryReadsAsPythonZipfileReadsIt) {
  ZCKPT_REQUIRE_TORCH();
  size_t files = 0;
  for (const char* kind : {"zip", "nocrc", "plainzip"}) {
    for (const auto& f : FixturesOfKind(kind)) {
      ExpectMatchesManifest(f.path());
      ++files;
    }
  }
  EXPECT_EQ(files, 12u);  // 10 torch.save shapes, the CRC-less one, Python's stored copy
}

TEST(ZipReaderTorchFixtures, TorchPayloadsAre64ByteAlignedOthersNeedNotBe) {
  ZCKPT_REQUIRE_TORCH();
  for (const auto& f : FixturesOfKind("zip")) {
    ZipArchive zip = ZipArchive::Open(f.path());
    for (const ZipEntry& e : zip.entries()) EXPECT_EQ(e.data_offset % 64, 0u) << f.file << ": " << e.name;
  }
  // Python's zipfile does not pad: its copy must have unaligned payloads, or the check above
  // proves nothing about how data offsets are computed.
  ZipArchive plain = ZipArchive::Open(FixtureNamed("plainzip.zip").path());
  EXPECT_TRUE(std::any_of(plain.entries().begin(), plain.entries().end(),
                          [](const ZipEntry& e) { return e.data_offset % 64 != 0; }));
}

TEST(ZipReaderTorchFixtures, CrcsVerify) {
  ZCKPT_REQUIRE_TORCH();
  for (const auto& f : FixturesOfKind("zip")) {
    ZipArchive zip = ZipArchive::Open(f.path());
    std::vector<ExpectedEntry> expected = ReadManifest(f.path());
    ASSERT_EQ(expected.size(), zip.entries().size());
    for (size_t i = 0; i < expected.size(); ++i) {
      CrcCheck check = zip.VerifyCrc(zip.entries()[i]);
      EXPECT_EQ(check.status, CrcCheck::Status::kMatch) << f.file << ": " << expected[i].name;
      EXPECT_EQ(check.computed, expected[i].crc);
      EXPECT_TRUE(check.ok());
    }
  }
}

TEST(ZipReaderTorchFixtures, SkippedCrcIsReportedAsNotRecorded) {
  ZCKPT_REQUIRE_TORCH();
  ZipArchive zip = ZipArchive::Open(FixtureNamed("nocrc.pt").path());
  ASSERT_FALSE(zip.entries().empty());
  for (const ZipEntry& e : zip.entries()) {
    ASSERT_GT(e.uncompressed_size, 0u);
    CrcCheck check = zip.VerifyCrc(e);
    EXPECT_EQ(check.status, CrcCheck::Status::kNotRecorded) << e.name;
    EXPECT_EQ(check.recorded, 0u);
    EXPECT_NE(check.computed, 0u);
    EXPECT_TRUE(check.ok());
  }
}

TEST(ZipReaderTorchFixtures, DamagedPayloadFailsItsCrc) {
  ZCKPT_REQUIRE_TORCH();
  std::vector<uint8_t> bytes = zckpt::testing::ReadFileBytes(FixtureNamed("small.pt").path());
  ZipArchive original = ZipArchive::Open(FixtureNamed("small.pt").path());
  const ZipEntry* storage = original.Find("small/data/0");
  ASSERT_NE(storage, nullptr);
  bytes.at(storage->data_offset + 1) ^= 0x40;
  ZipArchive zip(MapBytes(bytes));
  CrcCheck check = zip.VerifyCrc(*zip.Find("small/data/0"));
  EXPECT_EQ(check.status, CrcCheck::Status::kMismatch);
  EXPECT_EQ(check.recorded, storage->crc32);
  EXPECT_NE(check.computed, storage->crc32);
  EXPECT_FALSE(check.ok());
}

TEST(ZipReaderTorchFixtures, TwentyThousandTensors) {
  ZCKPT_REQUIRE_TORCH();
  ZipArchive zip = ZipArchive::Open(FixtureNamed("t20k.pt").path());
  // data.pkl, .format_version, .storage_alignment, byteorder, version, .data/serialization_id
  EXPECT_EQ(zip.entries().size(), 20000u + 6u);
  const ZipEntry* last = zip.Find("t20k/data/19999");
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->uncompressed_size, 4u);  // one int32
  EXPECT_EQ(zip.Find("t20k/data/20000"), nullptr);
}

TEST(ZipReaderTorchFixtures, DeflatedEntryIsUnsupportedWhenRead) {
  ZCKPT_REQUIRE_TORCH();
  ZipArchive zip = ZipArchive::Open(FixtureNamed("deflate.zip").path());
  const ZipEntry* pickle = zip.Find("small/data.pkl");
  ASSERT_NE(pickle, nullptr);
  EXPECT_EQ(pickle->method, 8);  // deflate
  EXPECT_ZCKPT_ERROR(zip.Data(*pickle), ErrorKind::kUnsupported, "'small/data.pkl' is compressed (method 8)");
  EXPECT_ZCKPT_ERROR(zip.VerifyCrc(*pickle), ErrorKind::kUnsupported, "small/data.pkl");
}

TEST(ZipReader, FindOnlyExactNames) {
  ZipArchive zip(MapBytes(testing::BuildArchive({{"data.pkl", "P"}, {"data/0", "xyz"}})));
  ASSERT_EQ(zip.entries().size(), 2u);
  EXPECT_NE(zip.Find("archive/data/0"), nullptr);
  EXPECT_EQ(zip.Find("data/0"), nullptr);
  EXPECT_EQ(zip.Find("archive/data/"), nullptr);
  EXPECT_EQ(zip.Find(""), nullptr);
}

TEST(ZipReader, EmptyZipHasNoEntries) {
  // Just an end of central directory record: what zipfile writes for an empty archive.
  std::vector<uint8_t> bytes = {'P', 'K', 5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  ZipArchive zip(MapBytes(bytes));
  EXPECT_TRUE(zip.entries().empty());
  EXPECT_EQ(zip.central_directory_offset(), 0u);
}

TEST(ZipReader, MissingFileIsAnIoError) {
  EXPECT_ZCKPT_ERROR(ZipArchive::Open("/nonexistent/zckpt/x.pt"), ErrorKind::kIo, "/nonexistent/zckpt/x.pt");
}

TEST(ZipReader, EmptyEntryHasAnEmptySpan) {
  ZipArchive zip(MapBytes(testing::BuildArchive({{"empty", ""}, {"data.pkl", "P"}})));
  const ZipEntry* empty = zip.Find("archive/empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_TRUE(zip.Data(*empty).empty());
  EXPECT_EQ(zip.VerifyCrc(*empty).status, CrcCheck::Status::kMatch);
}

}  // namespace
}  // namespace zckpt::pt
