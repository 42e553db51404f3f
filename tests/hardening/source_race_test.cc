// Sources that shrink while convert and merge read them (issue 11, item 2, for the read paths
// beside the container's): every read of a source's bytes after its parse goes through pread
// (MappedFile::ReadAt / ReadView), so a truncation is Error(kIo) naming the file, never SIGBUS,
// and nothing appears at the destination. Also the one file copy the DCP and merge paths share.
// And the small headers parsed before that (issue 22, part 4): a zip archive's end records,
// central directory and local headers, a safetensors file's length and JSON header, are copied
// into private memory before the parser looks at them, so a source truncated before or during
// its parse is Error(kIo) naming it too (read from the mapping, the parse died of SIGBUS).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/folder.h"
#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "merge/assemble.h"
#include "pickle/legacy.h"
#include "pt/zip_reader.h"
#include "pt/zip_writer.h"
#include "safetensors/header.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt::hardening {
namespace {

using testing::TempDir;

// A safetensors file of `tensors` float32 tensors of `floats` elements each.
void WriteSafetensors(const std::string& path, int tensors, uint64_t floats) {
  std::string json = "{";
  for (int i = 0; i < tensors; ++i) {
    uint64_t b = i * floats * 4, e = b + floats * 4;
    json += (i ? "," : "") + std::string("\"t") + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[" +
            std::to_string(floats) + "],\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
  }
  json += "}";
  while (json.size() % 8) json += ' ';
  std::vector<uint8_t> bytes(8 + json.size() + tensors * floats * 4, 0x3f);
  for (int k = 0; k < 8; ++k) bytes[k] = static_cast<uint8_t>(json.size() >> (8 * k));
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  testing::WriteFileBytes(path, bytes);
}

void ExpectShrankError(const Error& e, const std::string& path) {
  EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("changed size while being read"), std::string::npos) << e.what();
}

// A torch.save-like zip of `records` records of `bytes` bytes each.
void WriteZip(const std::string& path, int records, size_t bytes) {
  pt::TorchZipWriter w(path, "model");
  std::vector<uint8_t> payload(bytes, 0x5a);
  for (int i = 0; i < records; ++i) w.WriteRecord("data/" + std::to_string(i), payload);
  w.Commit();
}

TEST(SourceRace, HeadersOfASourceTruncatedBeforeTheirParseAreIoErrorsNotSigbus) {
  TempDir dir;
  const std::string zip = dir.File("model.pt"), st = dir.File("model.safetensors");
  WriteZip(zip, 64, 64 << 10);  // 4 MiB; the central directory is in the last page
  WriteSafetensors(st, 3, 1 << 20);
  {
    auto file = std::make_shared<const MappedFile>(zip);
    EXPECT_EQ(pt::ZipArchive(file).entries().size(), 64u);
  }
  for (uint64_t keep : {uint64_t{0}, uint64_t{4096}, uint64_t{2} << 20}) {
    SCOPED_TRACE("truncated to " + std::to_string(keep) + " bytes after the open");
    {
      auto file = std::make_shared<const MappedFile>(zip);  // mapped whole, then it shrinks
      ASSERT_EQ(::truncate(zip.c_str(), static_cast<off_t>(keep)), 0);
      try {
        pt::ZipArchive archive(file);
        ADD_FAILURE() << "parsed the central directory of a truncated archive";
      } catch (const Error& e) {
        ExpectShrankError(e, zip);
      }
      WriteZip(zip, 64, 64 << 10);
    }
    {
      MappedFile file(st);
      ASSERT_EQ(::truncate(st.c_str(), static_cast<off_t>(keep > 8 ? 64 : keep)), 0);  // inside the JSON
      std::vector<uint8_t> json;
      try {
        (void)safetensors::ReadFileHeader(file, &json);
        ADD_FAILURE() << "parsed the header of a truncated safetensors file";
      } catch (const Error& e) {
        ExpectShrankError(e, st);
      }
      WriteSafetensors(st, 3, 1 << 20);
    }
  }
}

TEST(SourceRace, ALegacyFileTruncatedBeforeItsParseIsAnIoErrorNotSigbus) {
  if (!testing::PythonHasTorch()) GTEST_SKIP() << "no torch to write a legacy .pt";
  TempDir dir;
  const std::string path = dir.File("legacy.pt");
  std::string out;
  ASSERT_EQ(testing::RunPython("tests/hardening/make_pt.py", {path, "3", "1", "--legacy"}, &out), 0) << out;
  const std::vector<uint8_t> original = testing::ReadFileBytes(path);
  {
    MappedFile file(path);
    EXPECT_GT(pickle::ReadLegacy(file).storages.size(), 0u);  // intact: parses
  }
  for (uint64_t keep : {uint64_t{0}, uint64_t{100}, uint64_t{1} << 20}) {
    SCOPED_TRACE("truncated to " + std::to_string(keep) + " bytes after the open");
    {
      MappedFile file(path);
      ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(keep)), 0);
      try {
        (void)pickle::ReadLegacy(file);
        ADD_FAILURE() << "parsed a truncated legacy file";
      } catch (const Error& e) {
        ExpectShrankError(e, path);
      }
    }
    testing::WriteFileBytes(path, original);
  }
}

// A thread truncates the source and writes it back, again and again, while it is parsed in a
// loop (the zip archive's directory; the whole conversion of the safetensors file): each parse
// succeeds (a conversion's destination then verifies) or fails with an Error (kIo naming the
// source, or kCorrupt/kNotContainer for what a half-written source looked like), never a SIGBUS.
// Bounded: 60 parses per source kind.
TEST(SourceRace, ParsingRacingATruncatingWriterSucceedsOrFailsCleanly) {
  TempDir dir;
  for (const std::string name : {"model.pt", "model.safetensors"}) {
    SCOPED_TRACE(name);
    const std::string src = dir.File(name), dst = dir.File("out.zckpt");
    if (name == "model.pt") WriteZip(src, 256, 1024);  // a central directory of several pages
    else WriteSafetensors(src, 64, 256);                // a JSON header of several pages
    const std::vector<uint8_t> original = testing::ReadFileBytes(src);
    std::atomic<bool> stop{false};
    std::thread changer([&] {
      std::mt19937_64 rng(22);
      int fd = ::open(src.c_str(), O_WRONLY);
      while (!stop) {
        (void)!::ftruncate(fd, static_cast<off_t>(rng() % original.size()));
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        (void)!::pwrite(fd, original.data(), original.size(), 0);
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      }
      ::close(fd);
    });
    int ok = 0, io = 0, other = 0;
    for (int n = 0; n < 60; ++n) {
      try {
        if (name == "model.pt") {
          pt::ZipArchive archive(std::make_shared<const MappedFile>(src));
        } else {
          ConvertFile(src, dst, ConvertOptions{});
          EXPECT_TRUE(Container::Open(dst)->Verify().ok());
        }
        ok++;
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kIo) {
          EXPECT_NE(std::string(e.what()).find(src), std::string::npos) << e.what();
          io++;
        } else {
          other++;
        }
      }
    }
    stop = true;
    changer.join();
    std::printf("%s: %d parsed, %d shrank (kIo), %d malformed while half written\n", name.c_str(), ok, io, other);
    EXPECT_EQ(ok + io + other, 60);
  }
}

TEST(SourceRace, ConvertOfASourceTruncatedAfterItsParseIsAnIoErrorNamingIt) {
  TempDir dir;
  const std::string src = dir.path() + "/model.safetensors", dst = dir.path() + "/model.zckpt";
  WriteSafetensors(src, 3, 1 << 20);  // 12 MiB of storages
  const uint64_t header_end = 8 + 256;  // well inside the first tensor's bytes
  ConvertOptions options;
  bool truncated = false;
  options.progress = [&](uint64_t, uint64_t) {  // first called once the header is parsed
    if (!truncated) ASSERT_EQ(::truncate(src.c_str(), static_cast<off_t>(header_end)), 0);
    truncated = true;
  };
  try {
    ConvertFile(src, dst, options);
    FAIL() << "converted a file truncated under it";
  } catch (const Error& e) {
    ExpectShrankError(e, src);
  }
  EXPECT_TRUE(truncated);
  EXPECT_FALSE(testing::FileExists(dst));
}

TEST(SourceRace, MergeOfAFileTruncatedAfterDiscoveryIsAnIoErrorNamingIt) {
  TempDir dir;
  const std::string path = dir.path() + "/rank.distcp";
  std::vector<float> values(1 << 20, 1.5f);
  testing::WriteFileBytes(path, std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(values.data()),
                                                     reinterpret_cast<const uint8_t*>(values.data() + values.size())));
  MappedFile file(path);
  merge::Piece p;
  p.view.what = path + ": tensor 't'";
  p.view.file = &file;
  p.view.bytes = file.data();
  p.view.bytes_size = file.size();
  p.view.dtype = DType::kFloat32;
  p.view.shape = {static_cast<int64_t>(values.size())};
  p.view.stride = {1};
  p.offsets = {0};
  merge::FullTensor t{"t", DType::kFloat32, p.view.shape, {p}};
  merge::Tile(t);
  std::vector<float> out(values.size());
  merge::Assembler().Assemble(t, reinterpret_cast<uint8_t*>(out.data()));  // intact: read whole
  EXPECT_EQ(out, values);
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  try {
    merge::Assembler().Assemble(t, reinterpret_cast<uint8_t*>(out.data()));
    FAIL() << "assembled from a file truncated under it";
  } catch (const Error& e) {
    ExpectShrankError(e, path);
  }
}

// A slice of a mapping read as its own file (a .distcp item parsed as a torch.save archive): its
// reads are guarded too, so the slice's name (the file and byte range) is in the error.
TEST(SourceRace, ASliceOfATruncatedMappingIsAnIoErrorNotSigbus) {
  TempDir dir;
  const std::string path = dir.path() + "/f.distcp";
  testing::WriteFileBytes(path, std::vector<uint8_t>(3 * 65536, 7));
  MappedFile file(path);
  MappedFile slice(file.data() + 65536, 2 * 65536, path + " bytes [65536, 196608)");
  std::vector<uint8_t> got(65536);
  slice.ReadAt(0, got.size(), got.data());
  EXPECT_EQ(got, std::vector<uint8_t>(65536, 7));
  ASSERT_EQ(::truncate(path.c_str(), 65536), 0);
  try {
    slice.ReadAt(65536, got.size(), got.data());
    FAIL() << "read past the end of a truncated file";
  } catch (const Error& e) {
    ExpectShrankError(e, path + " bytes [65536, 196608)");
  }
  try {
    (void)file.CopyView({file.data() + 65536, 65536});
    FAIL() << "read past the end of a truncated file";
  } catch (const Error& e) {
    ExpectShrankError(e, path);
  }
}

TEST(SourceRace, CopyFileToReadsOnlyRegularFilesAndWritesOnlyOverThem) {
  TempDir dir;
  const std::string src = dir.path() + "/config.json", fifo = dir.path() + "/pipe", dst = dir.path() + "/out.json";
  testing::WriteFileBytes(src, {'{', '}'});
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    checkpoint::CopyFileTo(fifo, dst);  // would block forever on a plain open
    FAIL() << "read a FIFO";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file (a FIFO)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(testing::FileExists(dst));
  try {
    checkpoint::CopyFileTo(src, fifo);
    FAIL() << "replaced a FIFO";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
  }
  struct stat st;
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  checkpoint::CopyFileTo(src, dst);
  EXPECT_EQ(testing::ReadFileBytes(dst), testing::ReadFileBytes(src));
}

}  // namespace
}  // namespace zckpt::hardening
