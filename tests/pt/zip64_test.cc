// ZIP64: payloads and offsets past 4 GiB, as real checkpoint shards have. The records torch's
// writer would emit are built with zip_records into a SPARSE file (headers written, the 5 GiB
// of zeros between them left as a hole), so the test costs kilobytes of disk; Python's zipfile
// reads the result as an independent check of the layout.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <algorithm>
#include <sstream>

#include "pt/pt_archive.h"
#include "pt/zip_format.h"
#include "pt/zip_reader.h"
#include "pt/zip_records.h"
#include "pt/zip_writer.h"
#include "pt_test_util.h"
#include "test_util.h"

namespace zckpt::pt {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

uint32_t Crc(std::string_view data) {
  return static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
}

// CRC-32 of n zero bytes without touching n bytes: CRCs of 1 MiB blocks doubled with
// crc32_combine.
uint32_t CrcOfZeros(uint64_t n) {
  static const std::string mib(1 << 20, '\0');
  uLong result = crc32(0L, Z_NULL, 0), block = Crc(mib);
  uint64_t block_len = mib.size();
  for (uint64_t blocks = n / mib.size(); blocks > 0; blocks >>= 1) {
    if (blocks & 1) result = crc32_combine(result, block, static_cast<z_off_t>(block_len));
    block = crc32_combine(block, block, static_cast<z_off_t>(block_len));
    block_len *= 2;
  }
  return static_cast<uint32_t>(crc32_combine(result, Crc(mib.substr(0, n % mib.size())), static_cast<z_off_t>(n % mib.size())));
}

// Writes entries the way TorchZipWriter lays them out, but seeks over all-zero payloads.
class SparseZip {
 public:
  explicit SparseZip(const std::string& path) : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)) {}
  ~SparseZip() { ::close(fd_); }

  void Add(const std::string& name, const std::string& data) { Add(name, data.size(), data, Crc(data)); }
  void AddZeros(const std::string& name, uint64_t size) { Add(name, size, "", CrcOfZeros(size)); }
  void Finish() {
    uint64_t cd_offset = pos_;
    Put(cd_);
    Put(EncodeEndRecords(count_, cd_offset, cd_.size()));
  }

 private:
  void Add(const std::string& name, uint64_t size, const std::string& data, uint32_t crc) {
    StoredEntryInfo info{name, size, crc, pos_};
    Put(EncodeLocalHeader(name, size, pos_));
    if (data.empty()) {
      pos_ += size;  // a hole: reads back as zeros
    } else {
      Put(data);
    }
    Put(EncodeDataDescriptor(info));
    cd_ += EncodeCentralRecord(info);
    ++count_;
  }
  void Put(const std::string& bytes) {
    ASSERT_EQ(::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(pos_)), static_cast<ssize_t>(bytes.size()));
    pos_ += bytes.size();
  }

  int fd_;
  uint64_t pos_ = 0;
  uint64_t count_ = 0;
  std::string cd_;
};

TEST(Zip64Records, CrcOfZerosMatchesDirectCrc) {
  for (uint64_t n : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 20, (uint64_t{3} << 20) + 7}) {
    EXPECT_EQ(CrcOfZeros(n), Crc(std::string(n, '\0'))) << n;
  }
}

TEST(Zip64Records, LocalHeaderAlignsThePayloadAtAnyOffset) {
  const uint64_t offsets[] = {0, 1, 63, 64, 1000, zipfmt::kSentinel32 - 1, zipfmt::kSentinel32, 5 * kGiB + 17, uint64_t{1} << 40};
  const uint64_t sizes[] = {0, 10, zipfmt::kSentinel32 - 1, zipfmt::kSentinel32, 5 * kGiB};
  for (uint64_t offset : offsets) {
    for (uint64_t size : sizes) {
      for (size_t name_len = 1; name_len < 140; name_len += 13) {
        std::string name(name_len, 'n');
        std::string h = EncodeLocalHeader(name, size, offset);
        const uint8_t* p = reinterpret_cast<const uint8_t*>(h.data());
        SCOPED_TRACE(::testing::Message() << "offset " << offset << " size " << size << " name " << name_len);
        EXPECT_EQ((offset + h.size()) % 64, 0u);
        EXPECT_EQ(zipfmt::Load32(p), zipfmt::kLocalHeaderSig);
        EXPECT_EQ(zipfmt::Load16(p + zipfmt::kLocalExtraLen), h.size() - 30 - name_len);
        // The ZIP64 field (sizes when the size needs it, then the offset when that does)
        // comes first, then torch's "FB" padding with its length.
        uint64_t zip64_len = (size >= zipfmt::kSentinel32 ? 16 : 0) + (offset >= zipfmt::kSentinel32 ? 8 : 0);
        const uint8_t* extra = p + 30 + name_len;
        if (zip64_len > 0) {
          EXPECT_EQ(zipfmt::Load16(extra), zipfmt::kZip64ExtraId);
          EXPECT_EQ(zipfmt::Load16(extra + 2), zip64_len);
          if (size >= zipfmt::kSentinel32) {  // miniz: the size, then a compressed size of 0
            EXPECT_EQ(zipfmt::Load64(extra + 4), size);
            EXPECT_EQ(zipfmt::Load64(extra + 12), 0u);
          }
          if (offset >= zipfmt::kSentinel32) {
            EXPECT_EQ(zipfmt::Load64(extra + 4 + zip64_len - 8), offset);
          }
          extra += 4 + zip64_len;
        }
        EXPECT_EQ(zipfmt::Load16(extra), zipfmt::kTorchPaddingExtraId);
        EXPECT_EQ(zipfmt::Load16(extra + 2), h.size() - (extra + 4 - p));
        EXPECT_LT(zipfmt::Load16(extra + 2), 64);
        EXPECT_EQ(EntryNeedsZip64(size, offset), zip64_len > 0);
      }
    }
  }
}

TEST(Zip64Records, DataDescriptorSizes) {
  EXPECT_EQ(EncodeDataDescriptor({"a", 0, 0, 0}).size(), 0u);  // empty entries have none
  EXPECT_EQ(EncodeDataDescriptor({"a", 7, 1, 0}).size(), 16u);
  EXPECT_EQ(EncodeDataDescriptor({"a", 7, 1, 5 * kGiB}).size(), 24u);
  std::string big = EncodeDataDescriptor({"a", 5 * kGiB, 0xABCD, 0});
  ASSERT_EQ(big.size(), 24u);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(big.data());
  EXPECT_EQ(zipfmt::Load32(p + 4), 0xABCDu);
  EXPECT_EQ(zipfmt::Load64(p + 8), 5 * kGiB);
  EXPECT_EQ(zipfmt::Load64(p + 16), 5 * kGiB);
}

TEST(Zip64Records, EndRecordsSaturateThePlainRecord) {
  std::string end = EncodeEndRecords(70000, 6 * kGiB, 100);
  ASSERT_EQ(end.size(), 56u + 20u + 22u);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(end.data());
  EXPECT_EQ(zipfmt::Load64(p + zipfmt::kZip64EndTotalEntries), 70000u);
  EXPECT_EQ(zipfmt::Load64(p + zipfmt::kZip64EndCdOffset), 6 * kGiB);
  EXPECT_EQ(zipfmt::Load64(p + 56 + zipfmt::kLocatorZip64EndOffset), 6 * kGiB + 100);
  const uint8_t* eocd = p + 76;
  EXPECT_EQ(zipfmt::Load16(eocd + zipfmt::kEndTotalEntries), 0xFFFFu);
  EXPECT_EQ(zipfmt::Load32(eocd + zipfmt::kEndCdSize), 100u);
  EXPECT_EQ(zipfmt::Load32(eocd + zipfmt::kEndCdOffset), 0xFFFFFFFFu);
}

class Zip64SparseArchive : public ::testing::Test {
 protected:
  static constexpr uint64_t kBigSize = 5 * kGiB + 3;
  void SetUp() override {
    path_ = dir_.File("big.pt");
    SparseZip zip(path_);
    zip.Add("archive/data.pkl", pickle_);
    zip.AddZeros("archive/data/0", kBigSize);  // ZIP64 sizes
    zip.Add("archive/version", "3\n");          // header past 4 GiB: ZIP64 offset
    zip.Add("archive/byteorder", "little");
    zip.Finish();
  }
  zckpt::testing::TempDir dir_;
  std::string path_;
  std::string pickle_ = std::string("\x80\x02}q\x00.", 6) + std::string(94, 'p');
};

TEST_F(Zip64SparseArchive, ZipArchiveReadsSizesAndOffsetsPast4GiB) {
  ZipArchive zip = ZipArchive::Open(path_);
  ASSERT_EQ(zip.entries().size(), 4u);
  const ZipEntry& big = zip.entries()[1];
  const ZipEntry& version = zip.entries()[2];
  EXPECT_EQ(big.uncompressed_size, kBigSize);
  EXPECT_EQ(big.compressed_size, kBigSize);
  EXPECT_GT(version.local_header_offset, kBigSize);
  EXPECT_GT(zip.central_directory_offset(), kBigSize);
  for (const ZipEntry& e : zip.entries()) EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
  // The 32-bit fields really are sentinels, so the ZIP64 extra fields were what was read.
  const uint8_t* base = zip.file()->data();
  EXPECT_EQ(zipfmt::Load32(base + big.central_offset + zipfmt::kCentralUncompressedSize), zipfmt::kSentinel32);
  EXPECT_EQ(zipfmt::Load32(base + version.central_offset + zipfmt::kCentralLocalOffset), zipfmt::kSentinel32);

  EXPECT_EQ(zip.Data(big).size(), kBigSize);
  std::span<const uint8_t> v = zip.Data(version);
  EXPECT_EQ(std::string(v.begin(), v.end()), "3\n");
  EXPECT_EQ(zip.VerifyCrc(version).status, CrcCheck::Status::kMatch);
  EXPECT_EQ(zip.VerifyCrc(zip.entries()[0]).status, CrcCheck::Status::kMatch);
  EXPECT_EQ(big.crc32, CrcOfZeros(kBigSize));
}

TEST_F(Zip64SparseArchive, TorchArchiveSeesTheBigStorage) {
  TorchArchive archive = TorchArchive::Open(path_);
  EXPECT_EQ(archive.prefix(), "archive");
  EXPECT_EQ(archive.StorageRecord("0").size(), kBigSize);
  EXPECT_EQ(archive.RecordNames(), (std::vector<std::string>{"data.pkl", "data/0", "version", "byteorder"}));
}

TEST_F(Zip64SparseArchive, PythonZipfileAgrees) {
  if (zckpt::testing::TestPython().empty()) GTEST_SKIP() << "no project Python";
  std::string output;
  ASSERT_EQ(zckpt::testing::RunPython("tests/pt/zip_probe.py", {path_}, &output), 0) << output;
  ZipArchive zip = ZipArchive::Open(path_);
  std::ostringstream expected;
  auto hex = [](std::span<const uint8_t> d) {
    std::string s;
    char buf[3];
    for (uint8_t b : d) {
      std::snprintf(buf, sizeof buf, "%02x", b);
      s += buf;
    }
    return s;
  };
  for (const ZipEntry& e : zip.entries()) {
    expected << e.name << '\t' << e.uncompressed_size << '\t' << e.local_header_offset << '\t' << e.crc32 << '\t'
             << (e.uncompressed_size < (1 << 20) ? hex(zip.Data(e)) : "-") << '\n';
  }
  EXPECT_EQ(output, expected.str());
}

// The real thing, written by torch: a storage over 4 GiB, rewritten by TorchZipWriter from the
// mapping in pieces, must come out byte-identical. Needs ~9 GiB of disk and ~5 GiB of RAM for
// torch.save; runs only when asked.
TEST(Zip64Large, TorchWrittenOver4GiBRewritesByteIdentical) {
  const char* enabled = std::getenv("ZCKPT_PT_LARGE_TESTS");
  if (!enabled || std::string(enabled) != "1") GTEST_SKIP() << "set ZCKPT_PT_LARGE_TESTS=1 to run";
  ZCKPT_REQUIRE_TORCH();
  zckpt::testing::TempDir dir;
  std::string output;
  ASSERT_EQ(zckpt::testing::RunPython("tests/pt/make_large_fixture.py", {dir.File("large.pt")}, &output), 0) << output;

  TorchArchive archive = TorchArchive::Open(dir.File("large.pt"));
  std::span<const uint8_t> big = archive.StorageRecord("1");
  ASSERT_EQ(big.size(), (uint64_t{1} << 32) + 4099);
  EXPECT_EQ(big[0], 1);
  EXPECT_EQ(big[uint64_t{1} << 32], 2);
  EXPECT_EQ(big[big.size() - 1], 3);
  EXPECT_EQ(archive.zip().VerifyCrc(*archive.FindRecord("data/1")->entry).status, CrcCheck::Status::kMatch);
  EXPECT_GT(archive.FindRecord("data/2")->entry->local_header_offset, zipfmt::kSentinel32);

  TorchZipWriter writer(dir.File("rewrite.pt"), archive.prefix());
  for (const TorchRecord& r : archive.records()) {
    std::span<const uint8_t> data = archive.Record(r.name);
    writer.BeginRecord(r.name, data.size());
    for (size_t done = 0; done < data.size();) {
      size_t n = std::min<size_t>(data.size() - done, (size_t{64} << 20) + 11);
      writer.Append(data.subspan(done, n));
      done += n;
    }
    writer.EndRecord();
  }
  writer.Commit();
  MappedFile original(dir.File("large.pt")), rewrite(dir.File("rewrite.pt"));
  ASSERT_EQ(original.size(), rewrite.size());
  auto [a, b] = std::mismatch(original.data(), original.data() + original.size(), rewrite.data());
  EXPECT_EQ(a, original.data() + original.size()) << "first difference at byte " << (a - original.data())
                                                   << ": torch wrote " << int(*a) << ", we wrote " << int(*b);
}

}  // namespace
}  // namespace zckpt::pt
