// ZipArchive against damaged and forged archives: every one must fail with a zckpt::Error of
// the right kind, never crash or read outside the file.
#include <gtest/gtest.h>

#include <random>

#include "pt/pt_archive.h"
#include "pt/zip_format.h"
#include "pt/zip_reader.h"
#include "pt_test_util.h"
#include "test_util.h"

namespace zckpt::pt {
namespace {

using testing::MapBytes;
using testing::Put32;
using testing::Put64;

// A small writer-made archive and where its records are, to forge fields at known places.
struct Forgery {
  std::vector<uint8_t> bytes;
  std::vector<ZipEntry> entries;
  uint64_t cd_offset = 0;
  uint64_t end = 0;        // end of central directory record
  uint64_t locator = 0;    // ZIP64 locator
  uint64_t zip64_end = 0;  // ZIP64 end record

  Forgery() : Forgery({{"data.pkl", "PICKLE"}, {"data/0", "0123456789abcdef"}, {"data/1", "ABCDEFGH"}, {"version", "3\n"}}) {}
  explicit Forgery(const std::vector<std::pair<std::string, std::string>>& records)
      : bytes(testing::BuildArchive(records)) {
    ZipArchive zip(MapBytes(bytes));
    entries = zip.entries();
    cd_offset = zip.central_directory_offset();
    end = bytes.size() - zipfmt::kEndSize;
    locator = end - zipfmt::kZip64LocatorSize;
    zip64_end = locator - zipfmt::kZip64EndSize;
  }
  uint64_t central(size_t i, size_t field) const { return entries.at(i).central_offset + field; }

  // Adds an extra field to entry i's central record, moving everything after it along and
  // fixing the central directory size and the ZIP64 end record's offset so only the extra
  // field is new.
  void InsertCentralExtra(size_t i, const std::string& extra) {
    const ZipEntry& e = entries.at(i);
    uint16_t extra_len = zipfmt::Load16(&bytes[central(i, zipfmt::kCentralExtraLen)]);
    uint64_t at = e.central_offset + zipfmt::kCentralHeaderSize + e.name.size() + extra_len;
    bytes.insert(bytes.begin() + at, extra.begin(), extra.end());
    bytes[central(i, zipfmt::kCentralExtraLen)] = static_cast<uint8_t>(extra_len + extra.size());
    end += extra.size();
    locator += extra.size();
    zip64_end += extra.size();
    uint64_t cd_size = zipfmt::Load64(&bytes[zip64_end + zipfmt::kZip64EndCdSize]) + extra.size();
    Put64(bytes, zip64_end + zipfmt::kZip64EndCdSize, cd_size);
    Put32(bytes, end + zipfmt::kEndCdSize, static_cast<uint32_t>(cd_size));
    Put64(bytes, locator + zipfmt::kLocatorZip64EndOffset, zip64_end);
  }
  // Sets entry i's 32-bit sizes to the sentinel that defers them to a ZIP64 extra field.
  void DeferSizesToZip64(size_t i) {
    Put32(bytes, central(i, zipfmt::kCentralCompressedSize), zipfmt::kSentinel32);
    Put32(bytes, central(i, zipfmt::kCentralUncompressedSize), zipfmt::kSentinel32);
  }
  // Sets the ZIP64 end record's entry counts, with the plain record's 16-bit ones deferring.
  void SetZip64EntryCount(uint64_t n) {
    Put64(bytes, zip64_end + zipfmt::kZip64EndTotalEntries, n);
    Put64(bytes, zip64_end + zipfmt::kZip64EndDiskEntries, n);
    Put32(bytes, end + zipfmt::kEndDiskEntries, 0xFFFFFFFF);  // both 16-bit counts
  }
  void Open() const { ZipArchive zip(MapBytes(bytes)); }
};

std::string Zip64Extra(std::initializer_list<uint64_t> values) {
  std::string extra;
  zipfmt::Append16(extra, zipfmt::kZip64ExtraId);
  zipfmt::Append16(extra, static_cast<uint16_t>(values.size() * 8));
  for (uint64_t v : values) zipfmt::Append64(extra, v);
  return extra;
}

TEST(ZipHostile, ForgeryBaselineOpens) {
  Forgery f;
  ASSERT_EQ(f.entries.size(), 4u);
  EXPECT_NO_THROW(f.Open());
  f.InsertCentralExtra(1, std::string("\x34\x12\x02\x00", 4) + "ab");  // an unknown extra field is fine
  EXPECT_NO_THROW(f.Open());
}

TEST(ZipHostile, TorchArchiveTruncatedAtEveryLength) {
  ZCKPT_REQUIRE_TORCH();
  std::vector<uint8_t> whole = zckpt::testing::ReadFileBytes(testing::FixtureNamed("small.pt").path());
  ASSERT_GT(whole.size(), 1000u);
  ASSERT_NO_THROW(TorchArchive(MapBytes(whole)));
  for (size_t len = 0; len < whole.size(); ++len) {
    std::vector<uint8_t> part(whole.begin(), whole.begin() + len);
    // Under 4 bytes there is no "PK\3\4" to recognise; past that it is a damaged zip.
    ErrorKind expected = len < 4 ? ErrorKind::kNotContainer : ErrorKind::kCorrupt;
    EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(part)), expected, "") << "truncated to " << len;
    EXPECT_ZCKPT_ERROR(ZipArchive(MapBytes(part)), expected, "") << "truncated to " << len;
  }
}

TEST(ZipHostile, RandomBytesAreNotAContainer) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> bytes(rng() % 5000);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    EXPECT_ZCKPT_ERROR(ZipArchive(MapBytes(bytes)), ErrorKind::kNotContainer, "no end of central directory");
    EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(bytes)), ErrorKind::kNotContainer, "not a .pt file");
  }
  // Random bytes after a local header signature claim to be a zip: damaged, not foreign.
  std::vector<uint8_t> bytes = {'P', 'K', 3, 4};
  for (int i = 0; i < 2000; ++i) bytes.push_back(static_cast<uint8_t>(rng()));
  EXPECT_ZCKPT_ERROR(ZipArchive(MapBytes(bytes)), ErrorKind::kCorrupt, "no end of central directory");
}

// Random byte changes anywhere: the reader may accept (a payload byte changed) or refuse with
// a zckpt::Error, and anything it accepts must stay inside the file.
TEST(ZipHostile, RandomMutationsFailCleanly) {
  Forgery base;
  std::mt19937 rng(99);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 5000; ++i) {
    std::vector<uint8_t> bytes = base.bytes;
    int changes = 1 + static_cast<int>(rng() % 4);
    for (int c = 0; c < changes; ++c) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    try {
      ZipArchive zip(MapBytes(bytes));
      for (const ZipEntry& e : zip.entries()) {
        ASSERT_LE(e.data_offset + e.compressed_size, zip.central_directory_offset());
        if (e.method == 0) {
          ASSERT_EQ(zip.Data(e).size(), e.uncompressed_size);
        }
      }
      ++accepted;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

TEST(ZipHostile, MissingEndRecord) {
  Forgery f;
  f.bytes[f.end] = 'X';
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "no end of central directory record");
}

TEST(ZipHostile, BytesAfterTheEndRecord) {
  Forgery f;
  f.bytes.push_back(0);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "no end of central directory record");
  // ...unless the end record's comment covers them.
  f.bytes[f.end + zipfmt::kEndCommentLen] = 1;
  EXPECT_NO_THROW(f.Open());
}

TEST(ZipHostile, EndRecordDisagreesWithZip64Record) {
  Forgery f;
  Put32(f.bytes, f.end + zipfmt::kEndCdSize, zipfmt::Load32(&f.bytes[f.end + zipfmt::kEndCdSize]) + 1);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "disagrees with the ZIP64 record");
}

TEST(ZipHostile, CentralDirectoryOffsetPastTheEnd) {
  Forgery f;
  Put64(f.bytes, f.zip64_end + zipfmt::kZip64EndCdOffset, f.bytes.size() + 1000);
  Put32(f.bytes, f.end + zipfmt::kEndCdOffset, zipfmt::kSentinel32);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "central directory offset " + std::to_string(f.bytes.size() + 1000));
}

TEST(ZipHostile, CentralDirectoryNotEndingAtTheEndRecords) {
  Forgery f;
  Put64(f.bytes, f.zip64_end + zipfmt::kZip64EndCdSize, uint64_t{1} << 63);
  Put32(f.bytes, f.end + zipfmt::kEndCdSize, zipfmt::kSentinel32);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "does not end where the end records start");
}

TEST(ZipHostile, HugeEntryCount) {
  Forgery f;
  f.SetZip64EntryCount(uint64_t{1} << 40);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "1099511627776 entries cannot fit");
}

TEST(ZipHostile, EntryCountOffByOne) {
  Forgery more;
  more.SetZip64EntryCount(5);
  EXPECT_ZCKPT_ERROR(more.Open(), ErrorKind::kCorrupt, "no central directory record at byte");
  Forgery fewer;
  fewer.SetZip64EntryCount(3);
  EXPECT_ZCKPT_ERROR(fewer.Open(), ErrorKind::kCorrupt, "bytes after its 3 entries");
}

TEST(ZipHostile, OverlappingPayloads) {
  Forgery f;
  // Grow data.pkl's payload (6 bytes) so it runs over data/0's local header.
  uint32_t grown = static_cast<uint32_t>(f.entries[1].local_header_offset - f.entries[0].data_offset + 1);
  Put32(f.bytes, f.central(0, zipfmt::kCentralCompressedSize), grown);
  Put32(f.bytes, f.central(0, zipfmt::kCentralUncompressedSize), grown);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "overlaps the payload of entry 'archive/data.pkl'");
}

TEST(ZipHostile, TwoEntriesSharingOnePayload) {
  // data/1 renamed to data/0's name length and pointed at data/0's local header: caught as a
  // name mismatch, and with the local name patched too, as a duplicate.
  Forgery f;
  Put32(f.bytes, f.central(2, zipfmt::kCentralLocalOffset), static_cast<uint32_t>(f.entries[1].local_header_offset));
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "names 'archive/data/0' instead");
}

TEST(ZipHostile, LocalHeaderNameMismatch) {
  Forgery f;
  f.bytes[f.entries[3].local_header_offset + zipfmt::kLocalHeaderSize + 8] = 'V';  // archive/Version
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "local header at byte " + std::to_string(f.entries[3].local_header_offset) + " names 'archive/Version' instead");
}

TEST(ZipHostile, DuplicateNames) {
  Forgery f;
  // Rename data/1 to data/0 in both its local header and its central record.
  f.bytes[f.entries[2].local_header_offset + zipfmt::kLocalHeaderSize + f.entries[2].name.size() - 1] = '0';
  f.bytes[f.entries[2].central_offset + zipfmt::kCentralHeaderSize + f.entries[2].name.size() - 1] = '0';
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "'archive/data/0' (central directory record at byte " +
                                                        std::to_string(f.entries[2].central_offset) + "): duplicate entry name");
}

TEST(ZipHostile, LocalHeaderOutsideThePayloadArea) {
  Forgery f;
  Put32(f.bytes, f.central(1, zipfmt::kCentralLocalOffset), static_cast<uint32_t>(f.cd_offset - 10));
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "local header offset " + std::to_string(f.cd_offset - 10) + " is outside the payload area");
}

TEST(ZipHostile, LocalHeaderSignatureMissing) {
  Forgery f;
  Put32(f.bytes, f.central(1, zipfmt::kCentralLocalOffset), static_cast<uint32_t>(f.entries[1].local_header_offset + 1));
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "no local header signature");
}

TEST(ZipHostile, PayloadRunningIntoTheCentralDirectory) {
  Forgery f;
  Put32(f.bytes, f.central(3, zipfmt::kCentralCompressedSize), 100000);
  Put32(f.bytes, f.central(3, zipfmt::kCentralUncompressedSize), 100000);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "'archive/version'");
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "runs into the central directory");
}

TEST(ZipHostile, StoredSizesDisagree) {
  Forgery f;
  Put32(f.bytes, f.central(1, zipfmt::kCentralCompressedSize), 3);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "STORED entry has compressed size 3 but uncompressed size 16");
}

TEST(ZipHostile, CentralNameLengthRunsPastTheDirectory) {
  Forgery f;
  f.bytes[f.central(3, zipfmt::kCentralNameLen) + 1] = 0x7F;
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "runs past the end of the central directory");
}

TEST(ZipHostile, EncryptedEntry) {
  Forgery f;
  f.bytes[f.central(2, zipfmt::kCentralFlags)] |= 1;
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kUnsupported, "'archive/data/1' (central directory record at byte");
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kUnsupported, "encrypted");
}

TEST(ZipHostile, LocalMethodDisagrees) {
  Forgery f;
  f.bytes[f.entries[1].local_header_offset + zipfmt::kLocalMethod] = 8;
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "another compression method");
}

TEST(ZipHostile, MultiDisk) {
  Forgery f;
  f.bytes[f.end + zipfmt::kEndDisk] = 1;
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kUnsupported, "multi-disk");
  Forgery g;
  g.bytes[g.central(0, zipfmt::kCentralDiskStart)] = 2;
  EXPECT_ZCKPT_ERROR(g.Open(), ErrorKind::kUnsupported, "entry starts on disk 2");
}

TEST(ZipHostile, SentinelWithoutZip64Extra) {
  Forgery f;
  f.DeferSizesToZip64(1);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "no ZIP64 extra field");
}

TEST(ZipHostile, Zip64ExtraWithHugeSizes) {
  Forgery f;
  f.DeferSizesToZip64(1);
  f.InsertCentralExtra(1, Zip64Extra({uint64_t{1} << 62, uint64_t{1} << 62}));
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "of 4611686018427387904 bytes runs into the central directory");
}

TEST(ZipHostile, Zip64ExtraWithMaximalSizeDoesNotWrap) {
  Forgery f;
  f.DeferSizesToZip64(1);
  f.InsertCentralExtra(1, Zip64Extra({~uint64_t{0}, ~uint64_t{0}}));
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "runs into the central directory");
}

TEST(ZipHostile, Zip64ExtraWithHugeLocalOffset) {
  Forgery f;
  Put32(f.bytes, f.central(2, zipfmt::kCentralLocalOffset), zipfmt::kSentinel32);
  f.InsertCentralExtra(2, Zip64Extra({~uint64_t{0} - 5}));
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "local header offset 18446744073709551610 is outside the payload area");
}

TEST(ZipHostile, Zip64ExtraTooShort) {
  Forgery f;
  f.DeferSizesToZip64(1);
  f.InsertCentralExtra(1, Zip64Extra({16}));  // only the uncompressed size
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "ZIP64 extra field lacks the compressed size");
}

TEST(ZipHostile, ExtraFieldOverrun) {
  Forgery f;
  f.InsertCentralExtra(0, std::string("\x01\x00\x40\x00", 4) + "12345678");  // claims 64 bytes, has 8
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "extra field runs past the extra field area");
  Forgery g;
  g.InsertCentralExtra(0, "ab");  // not even a field header
  EXPECT_ZCKPT_ERROR(g.Open(), ErrorKind::kCorrupt, "ends inside a field header");
}

TEST(ZipHostile, Zip64LocatorPointsNowhere) {
  Forgery f;
  Put64(f.bytes, f.locator + zipfmt::kLocatorZip64EndOffset, uint64_t{1} << 50);
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "ZIP64 end of central directory offset 1125899906842624");
  Forgery g;
  Put64(g.bytes, g.locator + zipfmt::kLocatorZip64EndOffset, g.zip64_end - 8);
  EXPECT_ZCKPT_ERROR(g.Open(), ErrorKind::kCorrupt, "no ZIP64 end of central directory signature");
}

TEST(ZipHostile, Zip64EndRecordSizeForged) {
  Forgery f;
  Put64(f.bytes, f.zip64_end + zipfmt::kZip64EndRecordSize, ~uint64_t{0});
  EXPECT_ZCKPT_ERROR(f.Open(), ErrorKind::kCorrupt, "declares size 18446744073709551615");
}

}  // namespace
}  // namespace zckpt::pt
