// TorchZipWriter: what it writes must read back (ZipArchive, Python's zipfile, torch.load),
// match torch's own bytes, and a failed or abandoned write must leave nothing behind.
#include <gtest/gtest.h>

#include "common/atomic_file.h"
#include "pt/pt_archive.h"
#include "pt/zip_format.h"
#include "pt/zip_reader.h"
#include "pt/zip_writer.h"
#include "pt_test_util.h"
#include "test_util.h"

namespace zckpt::pt {
namespace {

using testing::DescribeWithPython;
using testing::FixtureNamed;
using testing::FixturesOfKind;
using zckpt::testing::ListDir;
using zckpt::testing::ReadFileBytes;
using zckpt::testing::TempDir;

std::span<const uint8_t> AsBytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

// Streams `data` as one record, cycling through the given piece sizes.
void StreamRecord(TorchZipWriter& writer, const std::string& name, std::span<const uint8_t> data,
                  const std::vector<size_t>& pieces) {
  writer.BeginRecord(name, data.size());
  size_t done = 0;
  for (size_t i = 0; done < data.size(); ++i) {
    size_t n = std::min(pieces[i % pieces.size()], data.size() - done);
    writer.Append(data.subspan(done, n));
    done += n;
  }
  writer.EndRecord();
}

// Copies every record of a torch archive, streaming storages in odd-sized pieces.
void Rewrite(const TorchArchive& archive, const std::string& destination, const std::string& prefix) {
  TorchZipWriter writer(destination, prefix);
  for (const TorchRecord& r : archive.records()) {
    if (TorchArchive::IsStorageRecord(r.name)) {
      StreamRecord(writer, r.name, archive.Record(r.name), {1, 5, 977, (size_t{1} << 20) + 3});
    } else {
      writer.WriteRecord(r.name, archive.Record(r.name));
    }
  }
  writer.Commit();
}

// Makes the Nth write(2) of any AtomicFile fail with EIO, for this scope.
struct FailNthWrite {
  explicit FailNthWrite(int n) { SetAtomicFileFailAfterWrites(n); }
  ~FailNthWrite() { SetAtomicFileFailAfterWrites(0); }
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 977) % 251);
  return s;
}

class TorchZipWriterRecords : public ::testing::Test {
 protected:
  void SetUp() override {
    records_ = {{"data.pkl", "PICKLE."}, {"empty", ""},  {"one", "x"},         {"a63", std::string(63, 'a')},
                {"b64", std::string(64, 'b')}, {"c65", std::string(65, 'c')}, {"data/0", Pattern((3 << 20) + 5)},
                {"version", "3\n"}};
    TorchZipWriter writer(path_, "ckpt");
    for (const auto& [name, data] : records_) {
      if (name == "data/0") {
        StreamRecord(writer, name, AsBytes(data), {1, 7, 4093, (size_t{1} << 20) + 3});
      } else {
        writer.WriteRecord(name, AsBytes(data));
      }
    }
    EXPECT_EQ(writer.records_written(), records_.size());
    writer.Commit();
  }
  TempDir dir_;
  std::string path_ = dir_.File("out.pt");
  std::vector<std::pair<std::string, std::string>> records_;
};

TEST_F(TorchZipWriterRecords, ZipArchiveReadsThemBack) {
  ZipArchive zip = ZipArchive::Open(path_);
  ASSERT_EQ(zip.entries().size(), records_.size());
  for (size_t i = 0; i < records_.size(); ++i) {
    const ZipEntry& e = zip.entries()[i];
    const auto& [name, data] = records_[i];
    EXPECT_EQ(e.name, "ckpt/" + name);
    EXPECT_EQ(e.method, 0);
    EXPECT_EQ(e.flags, data.empty() ? 0x0800 : 0x0808) << name;  // data descriptor only with data
    EXPECT_EQ(e.data_offset % 64, 0u) << name;
    std::span<const uint8_t> got = zip.Data(e);
    EXPECT_EQ(std::string(got.begin(), got.end()), data) << name;
    EXPECT_EQ(zip.VerifyCrc(e).status, CrcCheck::Status::kMatch) << name;
  }
}

TEST_F(TorchZipWriterRecords, PythonZipfileReadsThemBack) {
  if (zckpt::testing::TestPython().empty()) GTEST_SKIP() << "no project Python";
  auto entries = DescribeWithPython(path_);  // also runs zipfile.testzip()
  ASSERT_EQ(entries.size(), records_.size());
  ZipArchive zip = ZipArchive::Open(path_);
  for (size_t i = 0; i < records_.size(); ++i) {
    EXPECT_EQ(entries[i].name, "ckpt/" + records_[i].first);
    EXPECT_EQ(std::string(entries[i].bytes.begin(), entries[i].bytes.end()), records_[i].second);
    EXPECT_EQ(entries[i].data_offset, zip.entries()[i].data_offset);
    EXPECT_EQ(entries[i].crc, zip.entries()[i].crc32);
  }
}

TEST(TorchZipWriterTorch, RewriteOfATorchFileIsByteIdentical) {
  ZCKPT_REQUIRE_TORCH();
  TempDir dir;
  size_t files = 0;
  for (const auto& f : FixturesOfKind("zip")) {
    SCOPED_TRACE(f.file);
    TorchArchive archive = TorchArchive::Open(f.path());
    Rewrite(archive, dir.File("rewrite.pt"), archive.prefix());
    EXPECT_TRUE(ReadFileBytes(dir.File("rewrite.pt")) == ReadFileBytes(f.path()));
    ++files;
  }
  EXPECT_EQ(files, 10u);
}

TEST(TorchZipWriterTorch, RewriteLoadsInTorchAsTheOriginal) {
  ZCKPT_REQUIRE_TORCH();
  TempDir dir;
  std::vector<std::string> pairs;
  for (const char* file : {"many.pt", "proto2.pt", "proto4.pt", "proto5.pt", "module.pt", "buffer.pt", "empty.pt",
                           "t20k.pt", "modèle_权重.pt", "nocrc.pt"}) {
    std::string original = FixtureNamed(file).path();
    std::string rewrite = dir.File(std::string("re_") + file);
    // A new prefix, as a converter writing to another name would use: torch must not care.
    Rewrite(TorchArchive::Open(original), rewrite, "renamed");
    ZipArchive zip = ZipArchive::Open(rewrite);
    for (const ZipEntry& e : zip.entries()) EXPECT_EQ(e.data_offset % 64, 0u) << file << ": " << e.name;
    pairs.push_back(original);
    pairs.push_back(rewrite);
  }
  std::string output;
  int rc = zckpt::testing::RunPython("tests/pt/check_torch_load.py", pairs, &output);
  EXPECT_EQ(rc, 0) << output;
  // many.pt (and proto*.pt) hold 24 tensors, three of them on one storage; t20k 20000.
  EXPECT_NE(output.find("OK 24 tensors\n"), std::string::npos) << output;
  EXPECT_NE(output.find("OK 20000 tensors\n"), std::string::npos) << output;
  EXPECT_NE(output.find("OK 0 tensors\n"), std::string::npos) << output;
}

TEST(TorchZipWriter, NothingAtTheDestinationUntilCommit) {
  TempDir dir;
  const std::string dest = dir.File("x.pt");
  zckpt::testing::WriteFileBytes(dest, {'o', 'l', 'd'});
  {
    TorchZipWriter writer(dest);
    writer.WriteRecord("data.pkl", AsBytes("P"));
    EXPECT_EQ(ReadFileBytes(dest), (std::vector<uint8_t>{'o', 'l', 'd'}));
    // The destination alone: the data is in an unnamed O_TMPFILE (or, without it, one temporary).
    EXPECT_LE(ListDir(dir.path()).size(), 2u);
    EXPECT_EQ(ListDir(dir.path())[0], "x.pt");
    writer.Commit();
  }
  EXPECT_EQ(ListDir(dir.path()), (std::vector<std::string>{"x.pt"}));
  EXPECT_EQ(TorchArchive::Open(dest).RecordNames(), (std::vector<std::string>{"data.pkl"}));
}

TEST(TorchZipWriter, DestroyedUncommittedLeavesNoFile) {
  TempDir dir;
  {
    TorchZipWriter writer(dir.File("x.pt"));
    writer.WriteRecord("data.pkl", AsBytes("P"));
    writer.BeginRecord("data/0", 100);
    writer.Append(AsBytes("only part"));
  }
  EXPECT_TRUE(ListDir(dir.path()).empty());
}

TEST(TorchZipWriter, WriteErrorWhileAppending) {
  TempDir dir;
  TorchZipWriter writer(dir.File("x.pt"));
  std::string big = Pattern(3 << 20);  // larger than AtomicFile's buffer: written at once
  writer.BeginRecord("data/0", big.size());
  {
    FailNthWrite fail(1);
    EXPECT_ZCKPT_ERROR(writer.Append(AsBytes(big)), ErrorKind::kIo,
                       "writing .pt archive record 'archive/data/0': cannot write " + dir.File("x.pt") +
                           ": Input/output error");
  }
  EXPECT_TRUE(ListDir(dir.path()).empty());  // temporary file already gone
  EXPECT_ZCKPT_ERROR(writer.Append(AsBytes("x")), ErrorKind::kInvalidArgument, "after a failed write");
  EXPECT_ZCKPT_ERROR(writer.Commit(), ErrorKind::kInvalidArgument, "after a failed write");
  EXPECT_TRUE(ListDir(dir.path()).empty());
}

TEST(TorchZipWriter, WriteErrorAtCommit) {
  TempDir dir;
  TorchZipWriter writer(dir.File("x.pt"));
  writer.WriteRecord("data.pkl", AsBytes("P"));  // small: still in AtomicFile's buffer
  {
    FailNthWrite fail(1);
    EXPECT_ZCKPT_ERROR(writer.Commit(), ErrorKind::kIo, "writing .pt archive central directory: cannot write");
  }
  EXPECT_TRUE(ListDir(dir.path()).empty());
  EXPECT_FALSE(zckpt::testing::FileExists(dir.File("x.pt")));
}

TEST(TorchZipWriter, Misuse) {
  TempDir dir;
  TorchZipWriter writer(dir.File("x.pt"));
  EXPECT_ZCKPT_ERROR(writer.Append(AsBytes("x")), ErrorKind::kInvalidArgument, "Append outside BeginRecord");
  EXPECT_ZCKPT_ERROR(writer.EndRecord(), ErrorKind::kInvalidArgument, "EndRecord without BeginRecord");
  EXPECT_ZCKPT_ERROR(writer.WriteRecord("", AsBytes("x")), ErrorKind::kInvalidArgument, "empty record name");
  writer.BeginRecord("data/0", 4);
  EXPECT_ZCKPT_ERROR(writer.Append(AsBytes("12345")), ErrorKind::kInvalidArgument,
                     "record 'archive/data/0' declared 4 bytes; appending 5 more after 0 exceeds it");
  writer.Append(AsBytes("123"));
  EXPECT_ZCKPT_ERROR(writer.EndRecord(), ErrorKind::kInvalidArgument, "declared 4 bytes but got 3");
  EXPECT_ZCKPT_ERROR(writer.WriteRecord("data/1", AsBytes("x")), ErrorKind::kInvalidArgument,
                     "BeginRecord while record 'archive/data/0' is still open (3 of 4 bytes written)");
  EXPECT_ZCKPT_ERROR(writer.Commit(), ErrorKind::kInvalidArgument, "Commit while record 'archive/data/0'");
  writer.Append(AsBytes("4"));
  writer.EndRecord();
  EXPECT_ZCKPT_ERROR(writer.WriteRecord("data/0", AsBytes("x")), ErrorKind::kInvalidArgument,
                     "record 'data/0' written twice");
  writer.Commit();
  EXPECT_ZCKPT_ERROR(writer.WriteRecord("data/2", AsBytes("x")), ErrorKind::kInvalidArgument, "after Commit");
  EXPECT_ZCKPT_ERROR(writer.Commit(), ErrorKind::kInvalidArgument, "after Commit");
  // The misuse left the committed archive intact.
  ZipArchive zip = ZipArchive::Open(dir.File("x.pt"));
  ASSERT_EQ(zip.entries().size(), 1u);
  EXPECT_EQ(zip.entries()[0].uncompressed_size, 4u);
}

TEST(TorchZipWriter, BadPrefix) {
  TempDir dir;
  EXPECT_ZCKPT_ERROR(TorchZipWriter(dir.File("x.pt"), ""), ErrorKind::kInvalidArgument, "invalid record prefix");
  EXPECT_ZCKPT_ERROR(TorchZipWriter(dir.File("x.pt"), "a/b"), ErrorKind::kInvalidArgument, "invalid record prefix 'a/b'");
  EXPECT_TRUE(ListDir(dir.path()).empty());
}

TEST(TorchZipWriter, UnwritableDestination) {
  EXPECT_ZCKPT_ERROR(TorchZipWriter("/nonexistent/zckpt/dir/x.pt"), ErrorKind::kIo, "/nonexistent/zckpt/dir/x.pt");
}

}  // namespace
}  // namespace zckpt::pt
