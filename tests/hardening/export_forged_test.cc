// Export of forged containers: metadata that names what the container does not hold is
// corruption of the input (kCorrupt, `zckpt export` exit 1, a message naming the file and what
// is missing), refused before anything appears at the destination.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/source_records.h"
#include "hardening_util.h"
#include "test_util.h"
#include "zckpt/container_writer.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt::hardening {
namespace {

using testing::ListDir;
using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A pickle of the integer 1 (protocol 2): something for data.pkl to hold.
const std::vector<uint8_t> kPickle = {0x80, 0x02, 0x4b, 0x01, 0x2e};

struct Forged {
  std::vector<std::string> records;  // zckpt.source.records, when not empty
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::string> blobs;  // names; contents are small
  bool storage = true;             // one storage, key "0"
};

void Write(const std::string& path, const Forged& f) {
  ContainerWriter w(path, {});
  if (f.storage) w.AddStorage(NewStorage{"0"}, Bytes("storage bytes"));
  for (const std::string& b : f.blobs) w.AddBlob(b, b == "data.pkl" ? kPickle : Bytes("blob " + b));
  if (!f.records.empty()) w.SetMetadata(std::string(checkpoint::kKeyRecords), checkpoint::JoinRecords(f.records));
  for (const auto& [k, v] : f.metadata) w.SetMetadata(k, v);
  w.Commit();
}

// ExportFile throws kCorrupt naming the file and `missing`; `zckpt export` exits 1 saying the
// same; nothing is left in the output folder.
void ExpectCorruptExport(const Forged& forged, const std::string& missing) {
  TempDir dir;
  const std::string src = dir.File("forged.zckpt"), out_dir = dir.File("out");
  Write(src, forged);
  testing::RunCommand("mkdir " + ShellQuote(out_dir));
  const std::string dest = out_dir + "/back.pt";
  try {
    ExportFile(src, dest);
    ADD_FAILURE() << "export of a container missing '" << missing << "' succeeded";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << ErrorKindName(e.kind()) << ": " << what;
    EXPECT_NE(what.find(src), std::string::npos) << "message does not name the file: " << what;
    EXPECT_NE(what.find("'" + missing + "'"), std::string::npos) << "message does not name '" << missing << "': " << what;
  }
  EXPECT_TRUE(ListDir(out_dir).empty());

  const std::string tool = ZckptTool();
  if (tool.empty()) return;
  std::string log;
  int rc = RunCommand(ShellQuote(tool) + " export " + ShellQuote(src) + " -o " + ShellQuote(dest), &log);
  EXPECT_EQ(rc, 1) << "exit 1 is 'corrupt', 2 'could not run': " << log;
  EXPECT_NE(log.find(src), std::string::npos) << log;
  EXPECT_NE(log.find("'" + missing + "'"), std::string::npos) << log;
  EXPECT_TRUE(ListDir(out_dir).empty());
}

TEST(ExportForged, RecordListNamingAMissingBlobIsCorrupt) {
  ExpectCorruptExport({{"data.pkl", "data/0", "extra/notes.txt"}, {{"zckpt.source.format", "zip"}},
                       {"data.pkl"}},
                      "extra/notes.txt");
}

TEST(ExportForged, RecordListNamingAMissingObjectPickleIsCorrupt) {
  ExpectCorruptExport({{"data.pkl", "data/0"}, {{"zckpt.source.format", "zip"}}, {}}, "data.pkl");
}

TEST(ExportForged, RecordListNamingAMissingStorageIsCorrupt) {
  // data/1 is neither a storage nor a blob.
  ExpectCorruptExport({{"data.pkl", "data/0", "data/1"}, {{"zckpt.source.format", "zip"}},
                       {"data.pkl"}},
                      "data/1");
}

TEST(ExportForged, LegacyWithoutItsHeaderIsCorrupt) {
  ExpectCorruptExport({{}, {{"zckpt.source.format", "legacy"}}, {"data.pkl"}}, "legacy.header");
}

TEST(ExportForged, CompleteForgeryStillExports) {
  // The same shapes with nothing missing export (the checks refuse only what is missing, unsafe
  // or inconsistent): a pickle that names no storage, so no storage either, and `version`.
  TempDir dir;
  const std::string src = dir.File("ok.zckpt"), dest = dir.File("ok.pt");
  Write(src, {{"data.pkl", "extra/notes.txt", "version"}, {{"zckpt.source.format", "zip"}},
              {"data.pkl", "extra/notes.txt", "version"}, /*storage=*/false});
  ExportFile(src, dest);
  EXPECT_TRUE(testing::FileExists(dest));
}


// ---- export --format safetensors of containers that say they came from a safetensors file ----

// One F32 [2] tensor "a" in storage "0", as convert writes it; `mutate` forges it first.
struct SafetensorsForgery {
  bool header_blob = true;
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  uint64_t storage_bytes = 8;
  DType tensor_dtype = DType::kFloat32;
  std::string storage_key = "0";
};

void WriteSafetensorsContainer(const std::string& path, const SafetensorsForgery& f) {
  ContainerWriter w(path, {});
  std::vector<uint8_t> bytes(f.storage_bytes, 0x11);
  w.AddStorage(NewStorage{f.storage_key, "cpu", DType::kFloat32}, bytes);
  NewTensor t;
  t.name = "a";
  t.dtype = f.tensor_dtype;
  t.shape = {2};
  t.stride = {1};
  w.AddTensor(t);
  if (f.header_blob) w.AddBlob(std::string(checkpoint::kSafetensorsHeaderBlob), Bytes(f.header));
  w.SetMetadata(std::string(checkpoint::kKeyFormat), "safetensors");
  w.Commit();
}

void ExpectCorruptSafetensorsExport(const SafetensorsForgery& forged, const std::string& fragment) {
  TempDir dir;
  const std::string src = dir.File("forged.zckpt"), out_dir = dir.File("out");
  WriteSafetensorsContainer(src, forged);
  testing::RunCommand("mkdir " + ShellQuote(out_dir));
  const std::string dest = out_dir + "/back.safetensors";
  try {
    ExportFile(src, dest, ExportFormat::kSafetensors);
    ADD_FAILURE() << "export of a forged container succeeded (expected '" << fragment << "')";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << ErrorKindName(e.kind()) << ": " << what;
    EXPECT_NE(what.find(src), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
  }
  EXPECT_TRUE(ListDir(out_dir).empty());
  const std::string tool = ZckptTool();
  if (tool.empty()) return;
  std::string log;
  int rc = RunCommand(ShellQuote(tool) + " export " + ShellQuote(src) + " -o " + ShellQuote(dest), &log);
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find(fragment), std::string::npos) << log;
  EXPECT_TRUE(ListDir(out_dir).empty());
}

TEST(ExportForgedSafetensors, TheHonestOneExportsByteForByte) {
  TempDir dir;
  const std::string src = dir.File("ok.zckpt"), dest = dir.File("ok.safetensors");
  SafetensorsForgery f;
  WriteSafetensorsContainer(src, f);
  ExportFile(src, dest, ExportFormat::kSafetensors);
  std::vector<uint8_t> want = {static_cast<uint8_t>(f.header.size()), 0, 0, 0, 0, 0, 0, 0};
  want.insert(want.end(), f.header.begin(), f.header.end());
  want.insert(want.end(), 8, 0x11);
  EXPECT_EQ(testing::ReadFileBytes(dest), want);
}

TEST(ExportForgedSafetensors, WithoutItsHeaderBlob) {
  SafetensorsForgery f;
  f.header_blob = false;
  ExpectCorruptSafetensorsExport(f, "'safetensors.header'");
}

TEST(ExportForgedSafetensors, AHeaderThatIsNotOne) {
  SafetensorsForgery f;
  f.header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";  // unclosed
  ExpectCorruptSafetensorsExport(f, "(kept header): safetensors header: not valid JSON");
}

TEST(ExportForgedSafetensors, AStorageOfAnotherSize) {
  SafetensorsForgery f;
  f.storage_bytes = 12;
  f.header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ExpectCorruptSafetensorsExport(f, "that storage holds 12 bytes");
}

TEST(ExportForgedSafetensors, ATensorOfAnotherDtype) {
  SafetensorsForgery f;
  f.tensor_dtype = DType::kInt32;
  ExpectCorruptSafetensorsExport(f, "its tensor is int32 [2]");
}

TEST(ExportForgedSafetensors, NoStorageWhereTheHeaderSays) {
  SafetensorsForgery f;
  f.storage_key = "first";
  ExpectCorruptSafetensorsExport(f, "the container has no storage '0'");
}

}  // namespace
}  // namespace zckpt::hardening
