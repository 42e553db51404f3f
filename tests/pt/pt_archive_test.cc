// TorchArchive and DetectPtFormat against files torch wrote, and against archives that break
// torch's conventions (prefix folder, data.pkl, byteorder, TorchScript).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "pt/pt_archive.h"
#include "pt/zip_format.h"
#include "pt/zip_writer.h"
#include "pt_test_util.h"
#include "test_util.h"

namespace zckpt::pt {
namespace {

using testing::BuildArchive;
using testing::FixtureNamed;
using testing::Fixtures;
using testing::FixturesOfKind;
using testing::MapBytes;
using testing::ReadManifest;
using testing::ToBytes;

PtFormat DetectFile(const std::string& path) {
  std::vector<uint8_t> bytes = zckpt::testing::ReadFileBytes(path);
  bytes.resize(std::min(bytes.size(), kPtFormatProbeBytes));
  return DetectPtFormat(bytes);
}

TEST(DetectPtFormat, EveryFixture) {
  ZCKPT_REQUIRE_TORCH();
  ASSERT_FALSE(Fixtures().empty());
  for (const auto& f : Fixtures()) {
    PtFormat expected = f.kind == "legacy"       ? PtFormat::kLegacy
                        : f.kind == "legacy-tar" ? PtFormat::kLegacyTar
                                                 : PtFormat::kZip;
    EXPECT_EQ(DetectFile(f.path()), expected) << f.file << " (" << f.kind << ")";
  }
  EXPECT_EQ(FixturesOfKind("legacy").size(), 3u);  // pickle protocols 2, 4, 5
}

TEST(DetectPtFormat, Synthetic) {
  EXPECT_EQ(DetectPtFormat({}), PtFormat::kUnknown);
  EXPECT_EQ(DetectPtFormat(ToBytes("PK\x03")), PtFormat::kUnknown);
  EXPECT_EQ(DetectPtFormat(ToBytes(std::string("PK\x03\x04", 4))), PtFormat::kZip);
  EXPECT_EQ(DetectPtFormat(ToBytes("PK\x05\x06")), PtFormat::kUnknown);  // an empty zip is no .pt
  EXPECT_EQ(DetectPtFormat(ToBytes("{\"json\": true}")), PtFormat::kUnknown);
  const std::string magic("\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 12);
  EXPECT_EQ(DetectPtFormat(ToBytes("\x80\x02" + magic)), PtFormat::kLegacy);
  EXPECT_EQ(DetectPtFormat(ToBytes("\x80\x04" + magic)), PtFormat::kLegacy);  // protocol 4, no FRAME
  EXPECT_EQ(DetectPtFormat(ToBytes(std::string("\x80\x04\x95\x0d\0\0\0\0\0\0\0", 11) + magic)), PtFormat::kLegacy);
  EXPECT_EQ(DetectPtFormat(ToBytes(std::string("\x80\x02\x8a\x0a", 4) + std::string(10, 'x'))), PtFormat::kUnknown);
  EXPECT_EQ(DetectPtFormat(ToBytes("\x80\x02" + magic.substr(0, 11))), PtFormat::kUnknown);  // cut short
  EXPECT_EQ(DetectPtFormat(ToBytes("\x80\x06" + magic)), PtFormat::kUnknown);  // no such protocol
  std::string tar(512, '\0');
  tar.replace(257, 5, "ustar");
  EXPECT_EQ(DetectPtFormat(ToBytes(tar)), PtFormat::kLegacyTar);
  EXPECT_STREQ(PtFormatName(PtFormat::kLegacyTar), "legacy-tar");
}

TEST(TorchArchiveFixtures, EveryTorchSaveShape) {
  ZCKPT_REQUIRE_TORCH();
  size_t opened = 0;
  for (const char* kind : {"zip", "nocrc", "plainzip"}) {
    for (const auto& f : FixturesOfKind(kind)) {
      SCOPED_TRACE(f.file);
      TorchArchive archive = TorchArchive::Open(f.path());
      EXPECT_EQ(archive.prefix(), f.prefix);
      EXPECT_TRUE(archive.little_endian());
      auto expected = ReadManifest(f.path());
      ASSERT_EQ(archive.records().size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        const TorchRecord& r = archive.records()[i];
        EXPECT_EQ(f.prefix + "/" + r.name, expected[i].name);
        EXPECT_EQ(archive.FindRecord(r.name), &r);
        std::span<const uint8_t> data = archive.Record(r.name);
        EXPECT_TRUE(std::equal(data.begin(), data.end(), expected[i].bytes.begin(), expected[i].bytes.end())) << r.name;
      }
      EXPECT_EQ(archive.records().front().name, "data.pkl");  // torch writes the pickle first
      ++opened;
    }
  }
  EXPECT_EQ(opened, 12u);
}

TEST(TorchArchiveFixtures, RecordNamesOfATorch2File) {
  ZCKPT_REQUIRE_TORCH();
  TorchArchive archive = TorchArchive::Open(FixtureNamed("small.pt").path());
  EXPECT_EQ(archive.RecordNames(), (std::vector<std::string>{"data.pkl", ".format_version", ".storage_alignment",
                                                             "byteorder", "data/0", "version",
                                                             ".data/serialization_id"}));
  std::span<const uint8_t> storage = archive.StorageRecord("0");  // torch.arange(3, dtype=int16)
  EXPECT_EQ(std::vector<uint8_t>(storage.begin(), storage.end()), (std::vector<uint8_t>{0, 0, 1, 0, 2, 0}));
  std::span<const uint8_t> order = archive.Record("byteorder");
  EXPECT_EQ(std::string(order.begin(), order.end()), "little");
}

TEST(TorchArchiveFixtures, StorageRecordsOfManyTensors) {
  ZCKPT_REQUIRE_TORCH();
  TorchArchive many = TorchArchive::Open(FixtureNamed("t20k.pt").path());
  size_t storages = std::count_if(many.records().begin(), many.records().end(),
                                  [](const TorchRecord& r) { return TorchArchive::IsStorageRecord(r.name); });
  EXPECT_EQ(storages, 20000u);
  std::span<const uint8_t> last = many.StorageRecord("19999");  // torch.tensor([19999], int32)
  ASSERT_EQ(last.size(), 4u);
  int32_t value;
  std::memcpy(&value, last.data(), 4);
  EXPECT_EQ(value, 19999);
  EXPECT_ZCKPT_ERROR(many.StorageRecord("20000"), ErrorKind::kCorrupt, "record 't20k/data/20000' is missing");
}

TEST(TorchArchiveFixtures, EmptyDictHasNoStorages) {
  ZCKPT_REQUIRE_TORCH();
  TorchArchive empty = TorchArchive::Open(FixtureNamed("empty.pt").path());
  EXPECT_EQ(empty.prefix(), "empty");
  EXPECT_TRUE(std::none_of(empty.records().begin(), empty.records().end(),
                           [](const TorchRecord& r) { return TorchArchive::IsStorageRecord(r.name); }));
  EXPECT_EQ(empty.records().size(), 6u);
}

TEST(TorchArchive, IsStorageRecord) {
  EXPECT_TRUE(TorchArchive::IsStorageRecord("data/0"));
  EXPECT_TRUE(TorchArchive::IsStorageRecord("data/140234"));
  EXPECT_FALSE(TorchArchive::IsStorageRecord("data/"));
  EXPECT_FALSE(TorchArchive::IsStorageRecord("data.pkl"));
  EXPECT_FALSE(TorchArchive::IsStorageRecord(".data/serialization_id"));
  EXPECT_FALSE(TorchArchive::IsStorageRecord("byteorder"));
}

TEST(TorchArchiveFixtures, OtherFormatsAreRefused) {
  ZCKPT_REQUIRE_TORCH();
  for (const auto& f : FixturesOfKind("legacy"))
    EXPECT_ZCKPT_ERROR(TorchArchive::Open(f.path()), ErrorKind::kUnsupported, "legacy torch.save format");
  EXPECT_ZCKPT_ERROR(TorchArchive::Open(FixtureNamed("legacy_tar.pt").path()), ErrorKind::kUnsupported, "tar-based");
  EXPECT_ZCKPT_ERROR(TorchArchive::Open(FixtureNamed("torchscript.pt").path()), ErrorKind::kUnsupported,
                     "TorchScript archive");
  // deflate.zip: a torch.save archive whose records Python re-zipped compressed.
  EXPECT_ZCKPT_ERROR(TorchArchive::Open(FixtureNamed("deflate.zip").path()), ErrorKind::kUnsupported,
                     "zip entry 'small/byteorder' is compressed");
}

TEST(TorchArchive, NotAPtFile) {
  zckpt::testing::TempDir dir;
  zckpt::testing::WriteFileBytes(dir.File("notes.txt"), ToBytes("just some text, long enough to look at"));
  zckpt::testing::WriteFileBytes(dir.File("empty.pt"), {});
  EXPECT_ZCKPT_ERROR(TorchArchive::Open(dir.File("notes.txt")), ErrorKind::kNotContainer, "notes.txt: not a .pt file");
  EXPECT_ZCKPT_ERROR(TorchArchive::Open(dir.File("empty.pt")), ErrorKind::kNotContainer, "not a .pt file");
}

TEST(TorchArchive, WriterMadeArchiveWithoutByteorderIsLittleEndian) {
  TorchArchive archive(MapBytes(BuildArchive({{"data.pkl", "P"}, {"data/0", "abcd"}, {"version", "3\n"}}, "ckpt")));
  EXPECT_EQ(archive.prefix(), "ckpt");
  EXPECT_TRUE(archive.little_endian());
  EXPECT_EQ(archive.StorageRecord("0").size(), 4u);
  EXPECT_EQ(archive.FindRecord("byteorder"), nullptr);
  EXPECT_EQ(archive.FindRecord("ckpt/data.pkl"), nullptr);  // names are without the prefix
}

TEST(TorchArchive, MissingDataPickle) {
  EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(BuildArchive({{"data/0", "abcd"}, {"version", "3\n"}}))),
                     ErrorKind::kCorrupt, "no archive/data.pkl record");
}

TEST(TorchArchive, ByteOrder) {
  EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(BuildArchive({{"data.pkl", "P"}, {"byteorder", "big"}}))),
                     ErrorKind::kUnsupported, "big-endian");
  EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(BuildArchive({{"data.pkl", "P"}, {"byteorder", "middle"}}))),
                     ErrorKind::kCorrupt, "byteorder record holds neither");
  EXPECT_NO_THROW(TorchArchive(MapBytes(BuildArchive({{"data.pkl", "P"}, {"byteorder", "little"}}))));
}

TEST(TorchArchive, TorchScriptMarker) {
  EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(BuildArchive({{"data.pkl", "P"}, {"constants.pkl", "C"}}))),
                     ErrorKind::kUnsupported, "TorchScript");
}

// Renames an entry in both its local header and central record (same length, so nothing moves).
std::vector<uint8_t> RenameEntry(std::vector<uint8_t> bytes, size_t index, const std::string& name) {
  ZipArchive zip(MapBytes(bytes));
  const ZipEntry& e = zip.entries().at(index);
  EXPECT_EQ(e.name.size(), name.size());
  std::memcpy(&bytes[e.local_header_offset + zipfmt::kLocalHeaderSize], name.data(), name.size());
  std::memcpy(&bytes[e.central_offset + zipfmt::kCentralHeaderSize], name.data(), name.size());
  return bytes;
}

TEST(TorchArchive, EntriesMustShareOnePrefixFolder) {
  std::vector<uint8_t> bytes = BuildArchive({{"data.pkl", "P"}, {"data/0", "abcd"}, {"version", "3\n"}});
  EXPECT_NO_THROW(TorchArchive(MapBytes(bytes)));
  EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(RenameEntry(bytes, 2, "archivX/version"))), ErrorKind::kCorrupt,
                     "entry 'archivX/version' is outside the archive folder 'archive/'");
  EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(RenameEntry(bytes, 0, "archive_data.pkl"))), ErrorKind::kCorrupt,
                     "first entry 'archive_data.pkl' is not inside a folder");
}

TEST(TorchArchive, EmptyZip) {
  std::vector<uint8_t> bytes = {'P', 'K', 5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(bytes)), ErrorKind::kNotContainer, "not a .pt file");
  // What TorchZipWriter makes of no records: end records only.
  std::vector<uint8_t> writer_empty;
  {
    zckpt::testing::TempDir dir;
    TorchZipWriter writer(dir.File("e.pt"));
    writer.Commit();
    writer_empty = zckpt::testing::ReadFileBytes(dir.File("e.pt"));
  }
  EXPECT_ZCKPT_ERROR(TorchArchive(MapBytes(writer_empty)), ErrorKind::kNotContainer, "not a .pt file");
}

}  // namespace
}  // namespace zckpt::pt
