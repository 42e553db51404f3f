// ParseLegacy against files torch wrote with _use_new_zipfile_serialization=False, a hand-made
// file with storage views (checked with torch.load by the script), and damaged copies.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "pickle/legacy.h"
#include "pickle_test_util.h"
#include "test_util.h"

namespace zckpt::pickle {
namespace {

std::string LegacyDir() {
  if (!zckpt::testing::PythonHasTorch()) return "";
  return testing::FixtureDir("tests/pickle/make_legacy_fixtures.py");
}

void CheckCase(const std::string& dir, const std::string& name) {
  SCOPED_TRACE(name);
  std::vector<uint8_t> file = testing::ReadBytes(dir + "/" + name + ".pt");
  ASSERT_TRUE(IsLegacyTorchFile(file));
  LegacyLayout l = ParseLegacy(file);
  size_t lstorages = 0, tensors = 0;
  for (const auto& row : testing::ReadTable(dir + "/" + name + ".expect")) {
    if (row[0] == "HEADER") {
      EXPECT_EQ(std::to_string(l.object_pickle_offset), row[1]);
      EXPECT_EQ(std::to_string(l.object_pickle_size), row[2]);
      EXPECT_EQ(std::to_string(l.keys_pickle_offset), row[3]);
      EXPECT_EQ(std::to_string(l.keys_pickle_size), row[4]);
      EXPECT_EQ(std::to_string(l.header_end), row[5]);
      EXPECT_EQ(std::to_string(l.data_end), row[6]);
    } else if (row[0] == "LSTORAGE") {
      ASSERT_LT(lstorages, l.storages.size());
      const LegacyStorage& s = l.storages[lstorages];
      EXPECT_EQ(s.key, row[1]);
      EXPECT_EQ(s.storage_type, row[2]);
      EXPECT_EQ(std::to_string(s.numel), row[3]);
      EXPECT_EQ(std::to_string(s.count_offset), row[4]);
      EXPECT_EQ(std::to_string(s.data_offset), row[5]);
      EXPECT_EQ(std::to_string(s.nbytes), row[6]);
      EXPECT_EQ(s.location, row[7]);
      // The span holds exactly the bytes torch had in memory.
      std::vector<uint8_t> expected = testing::ReadBytes(dir + "/" + name + "." + s.key + ".bin");
      ASSERT_EQ(expected.size(), s.nbytes);
      ASSERT_LE(s.data_offset + s.nbytes, file.size());
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), file.begin() + static_cast<std::ptrdiff_t>(s.data_offset)))
          << "storage " << s.key;
      // The model's storage list lines up with the data section.
      EXPECT_EQ(l.model.storages.at(lstorages).key, s.key);
      EXPECT_EQ(l.model.storages.at(lstorages).nbytes, s.nbytes);
      ++lstorages;
    } else if (row[0] == "TENSOR") {
      ++tensors;
      const TorchTensor* t = nullptr;
      for (const auto& x : l.model.tensors)
        if (x.name == row[1]) t = &x;
      ASSERT_NE(t, nullptr) << row[1];
      EXPECT_EQ(DTypeName(t->dtype), row[2]) << row[1];
      EXPECT_EQ(testing::Csv(t->shape), row[3]) << row[1];
      EXPECT_EQ(testing::Csv(t->stride), row[4]) << row[1];
      EXPECT_EQ(std::to_string(t->storage_offset), row[5]) << row[1];
      EXPECT_EQ(l.model.storages.at(t->storage).key, row[6]) << row[1];
    }
  }
  EXPECT_EQ(l.storages.size(), lstorages);
  EXPECT_EQ(l.model.tensors.size(), tensors);
}

class LegacyFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(LegacyFixtures, MatchIndependentReader) {
  ZCKPT_REQUIRE_TORCH();
  std::string dir = LegacyDir();
  ASSERT_FALSE(dir.empty());
  CheckCase(dir, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, LegacyFixtures, ::testing::Values("basic", "no_tensors", "proto4", "views"));

TEST(Legacy, ViewsResolveToTheirRoot) {
  ZCKPT_REQUIRE_TORCH();
  std::string dir = LegacyDir();
  ASSERT_FALSE(dir.empty());
  LegacyLayout l = ParseLegacy(testing::ReadBytes(dir + "/views.pt"));
  ASSERT_EQ(l.storages.size(), 2u);  // the views are not storages of their own
  ASSERT_EQ(l.model.tensors.size(), 4u);
  EXPECT_EQ(l.model.tensors[1].name, "view");
  EXPECT_EQ(l.model.tensors[1].storage, 0u);
  EXPECT_EQ(l.model.tensors[1].storage_offset, 5);
  EXPECT_NE(RenderTorch(l.objects, l.model).find("'view': <tensor 'view' float32[3]>"), std::string::npos)
      << RenderTorch(l.objects, l.model);
}

// Copies of basic.pt with one thing broken.
class LegacyDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!zckpt::testing::PythonHasTorch()) GTEST_SKIP() << "needs torch";
    std::string dir = LegacyDir();
    ASSERT_FALSE(dir.empty());
    file_ = testing::ReadBytes(dir + "/basic.pt");
    layout_ = ParseLegacy(file_);
  }
  Error Parse(const std::vector<uint8_t>& bytes) {
    return testing::CatchError([&] { ParseLegacy(bytes); });
  }
  std::vector<uint8_t> file_;
  LegacyLayout layout_;
};

TEST_F(LegacyDamage, ShortDataSection) {
  std::vector<uint8_t> cut(file_.begin(), file_.end() - 1);
  Error e = Parse(cut);
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  // Legacy keys are memory addresses sorted as strings, so which storage comes last varies
  // from run to run: an empty one ends in its element count, any other in its data.
  const LegacyStorage& last = layout_.storages.back();
  std::string want = last.nbytes > 0 ? "needs " + std::to_string(last.nbytes) + " bytes at offset " + std::to_string(last.data_offset)
                                     : "file ends inside the element count of storage '" + last.key + "'";
  EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
}

TEST_F(LegacyDamage, EveryTruncationFailsCleanly) {
  for (size_t n = 0; n < file_.size(); ++n) {
    std::vector<uint8_t> cut(file_.begin(), file_.begin() + static_cast<std::ptrdiff_t>(n));
    Error e = Parse(cut);
    EXPECT_TRUE(e.kind() == ErrorKind::kCorrupt || (n < 15 && e.kind() == ErrorKind::kNotContainer))
        << n << ": " << e.what();
  }
}

TEST_F(LegacyDamage, CountDisagreesWithThePickle) {
  std::vector<uint8_t> bad = file_;
  bad[layout_.storages[0].count_offset] ^= 1;
  Error e = Parse(bad);
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  EXPECT_NE(std::string(e.what()).find("storage '" + layout_.storages[0].key + "' has 7 elements in the data section but 6"),
            std::string::npos) << e.what();
}

TEST_F(LegacyDamage, WrongMagicProtocolOrEndianness) {
  std::vector<uint8_t> magic = file_;
  magic[5] ^= 0xFF;
  EXPECT_EQ(Parse(magic).kind(), ErrorKind::kNotContainer);
  // The protocol pickle (80 02 4d e9 03 2e: BININT2 1001) follows the 15-byte magic pickle.
  std::vector<uint8_t> proto = file_;
  ASSERT_EQ(proto[18], 0xe9);
  proto[18] = 0xea;
  Error p = Parse(proto);
  EXPECT_EQ(p.kind(), ErrorKind::kUnsupported);
  EXPECT_NE(std::string(p.what()).find("protocol 1002"), std::string::npos) << p.what();
  std::vector<uint8_t> endian = file_;
  const std::string key = "little_endian";
  auto it = std::search(endian.begin(), endian.end(), key.begin(), key.end());
  ASSERT_NE(it, endian.end());
  auto flag = std::find(it, endian.end(), 0x88);  // NEWTRUE after the key
  ASSERT_NE(flag, endian.end());
  *flag = 0x89;
  Error b = Parse(endian);
  EXPECT_EQ(b.kind(), ErrorKind::kUnsupported);
  EXPECT_NE(std::string(b.what()).find("big-endian"), std::string::npos) << b.what();
}

TEST_F(LegacyDamage, ObjectPickleErrorsGiveTheFileOffset) {
  std::vector<uint8_t> bad = file_;
  bad[layout_.object_pickle_offset + 2] = 0xff;  // the opcode after PROTO
  Error e = Parse(bad);
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  EXPECT_EQ(std::string(e.what()), "legacy torch file: object pickle at file offset " +
                                       std::to_string(layout_.object_pickle_offset) +
                                       ": pickle byte offset 2: unknown opcode 0xff");
}

TEST(Legacy, NotALegacyFile) {
  std::vector<uint8_t> zip = {'P', 'K', 3, 4, 0, 0};
  EXPECT_FALSE(IsLegacyTorchFile(zip));
  EXPECT_FALSE(IsLegacyTorchFile({}));
  Error e = testing::CatchError([&] { ParseLegacy(zip); });
  EXPECT_EQ(e.kind(), ErrorKind::kNotContainer);
  // A pickle of another big number is not the magic either.
  std::vector<uint8_t> other = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x18, 0x2e};
  EXPECT_FALSE(IsLegacyTorchFile(other));
}

}  // namespace
}  // namespace zckpt::pickle
