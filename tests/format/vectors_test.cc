// The committed test vectors of spec §10 (format-spec/vectors/) decode exactly as their JSON
// says, bad ones are refused for the stated reason, and the generator still produces them.
#include <gtest/gtest.h>
#include <zstd.h>

#include "spec_vectors.h"
#include "test_util.h"

namespace zckpt::testing {
namespace {

std::string VectorsDir() { return SourceRoot() + "/format-spec/vectors"; }

std::string ReadText(const std::string& path) {
  auto b = ReadFileBytes(path);
  return std::string(b.begin(), b.end());
}

// The value of `"key": "..."` in our own JSON (no escapes in these fields).
std::string Field(const std::string& json, const std::string& key) {
  std::string tag = "\"" + key + "\": \"";
  size_t at = json.find(tag);
  if (at == std::string::npos) return "";
  at += tag.size();
  return json.substr(at, json.find('"', at) - at);
}

std::vector<std::string> Committed(const std::string& ext) {
  std::vector<std::string> names;
  for (const auto& f : ListDir(VectorsDir()))
    if (f.size() > ext.size() && f.compare(f.size() - ext.size(), ext.size(), ext) == 0)
      names.push_back(f.substr(0, f.size() - ext.size()));
  return names;
}

TEST(SpecVectors, CommittedVectorsDecodeAsTheirJsonSays) {
  auto names = Committed(".json");
  ASSERT_GE(names.size(), 7u) << VectorsDir();
  EXPECT_EQ(Committed(".zckpt"), names);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    std::string json = ReadText(VectorsDir() + "/" + name + ".json");
    std::string path = VectorsDir() + "/" + name + ".zckpt";
    std::string stage = Field(json, "stage");
    EXPECT_EQ(stage.empty(), name.rfind("bad-", 0) != 0) << "only bad-* vectors are refused";
    if (stage.empty()) {
      auto c = Container::Open(path);
      EXPECT_EQ(DescribeContainerJson(*c), json);
      EXPECT_TRUE(c->Verify().ok());
      continue;
    }
    std::string kind = Field(json, "kind"), reason = Field(json, "reason");
    ASSERT_FALSE(reason.empty());
    try {
      auto c = Container::Open(path);
      ASSERT_EQ(stage, "verify") << "opened, but the vector says open refuses it";
      VerifyReport r = c->Verify();
      ASSERT_EQ(r.problems.size(), 1u);
      EXPECT_NE(r.problems[0].message.find(reason), std::string::npos) << r.problems[0].message;
      EXPECT_EQ(kind, "corrupt");
    } catch (const Error& e) {
      EXPECT_EQ(stage, "open") << e.what();
      EXPECT_EQ(ErrorKindName(e.kind()), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
}

// Values written out by hand, independently of the JSON generator.
TEST(SpecVectors, KnownValues) {
  std::string f32 = ReadText(VectorsDir() + "/f32-2x3.json");
  // 1.0, -2.0, 0.5, 3.25, 100.0, -0.125 as little-endian float32.
  EXPECT_NE(f32.find("\"values_hex\": \"0000803f000000c00000003f000050400000c842000000be\""), std::string::npos);
  EXPECT_NE(f32.find("\"shape\": [2, 3]"), std::string::npos);
  std::string view = ReadText(VectorsDir() + "/view.json");
  // a.T = [[1, 3.25], [-2, 100], [0.5, -0.125]]; row1 = [3.25, 100, -0.125]; last = -0.125.
  EXPECT_NE(view.find("\"values_hex\": \"0000803f00005040000000c00000c8420000003f000000be\""), std::string::npos);
  EXPECT_NE(view.find("\"values_hex\": \"000050400000c842000000be\""), std::string::npos);
  EXPECT_NE(view.find("\"shape\": [], \"stride\": [], \"storage_offset\": 5"), std::string::npos);
  EXPECT_EQ(ReadFileBytes(VectorsDir() + "/empty.zckpt").size(), 384u);
  EXPECT_NE(ReadText(VectorsDir() + "/zstd.json").find("\"codec\": \"zstd\""), std::string::npos);
}

// The committed files are what the generator writes today (run tools/make-spec-vectors.sh
// after a deliberate change).
TEST(SpecVectors, GeneratorReproducesCommittedFiles) {
  for (const auto& v : MakeSpecVectors()) {
    SCOPED_TRACE(v.name);
    auto bytes = ReadFileBytes(VectorsDir() + "/" + v.name + ".zckpt");
    std::string json = ReadText(VectorsDir() + "/" + v.name + ".json");
    if (v.depends_on_zstd_version && (bytes != v.bytes || json != v.json) && ZSTD_versionNumber() != 10504) {
      std::printf("note: %s differs under libzstd %s (made with 1.5.4)\n", v.name.c_str(), ZSTD_versionString());
      continue;
    }
    EXPECT_EQ(bytes, v.bytes);
    EXPECT_EQ(json, v.json);
  }
}

}  // namespace
}  // namespace zckpt::testing
