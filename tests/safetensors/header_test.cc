// The safetensors header reader and writer on files written by the `safetensors` package itself
// (make_fixtures.py, run now with the project's Python): what the reader finds is what Python
// finds in the header, and formatting what it read gives safetensors' own bytes back.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "safetensors/header.h"
#include "safetensors/header_writer.h"
#include "test_util.h"
#include "zckpt/error.h"

namespace zckpt::safetensors {
namespace {

using zckpt::testing::ReadFileBytes;

const std::string& FixtureDir() {
  static zckpt::testing::TempDir* dir = nullptr;
  if (!dir) {
    dir = new zckpt::testing::TempDir();  // lives for the process: the files are shared by tests
    std::string out;
    int rc = zckpt::testing::RunPython("tests/safetensors/make_fixtures.py", {dir->path()}, &out);
    EXPECT_EQ(rc, 0) << out;
  }
  return dir->path();
}

nlohmann::json Manifest() {
  auto bytes = ReadFileBytes(FixtureDir() + "/manifest.json");
  return nlohmann::json::parse(bytes.begin(), bytes.end());
}

TEST(SafetensorsHeader, ReadsWhatPythonReadsFromFilesSafetensorsWrote) {
  ZCKPT_REQUIRE_TORCH();
  nlohmann::json manifest = Manifest();
  ASSERT_GE(manifest.size(), 7u);
  for (const auto& [file, want] : manifest.items()) {
    SCOPED_TRACE(file);
    auto bytes = ReadFileBytes(FixtureDir() + "/" + file);
    Header h = ParseFile(bytes, file);
    EXPECT_EQ(h.header_bytes, want["header_bytes"].get<uint64_t>());
    EXPECT_EQ(h.data_offset + h.data_bytes, want["file_bytes"].get<uint64_t>());
    ASSERT_EQ(h.tensors.size(), want["tensors"].size());
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      const auto& w = want["tensors"][i];
      EXPECT_EQ(h.tensors[i].name, w["name"].get<std::string>());
      EXPECT_EQ(std::string(h.tensors[i].dtype.name), w["dtype"].get<std::string>());
      EXPECT_EQ(h.tensors[i].shape, w["shape"].get<std::vector<uint64_t>>());
      EXPECT_EQ(h.tensors[i].begin, w["data_offsets"][0].get<uint64_t>());
      EXPECT_EQ(h.tensors[i].end, w["data_offsets"][1].get<uint64_t>());
    }
    EXPECT_EQ(h.has_metadata, !want["metadata"].is_null());
    if (h.has_metadata) {
      ASSERT_EQ(h.metadata.size(), want["metadata"].size());
      for (size_t i = 0; i < h.metadata.size(); ++i) {
        EXPECT_EQ(h.metadata[i].first, want["metadata"][i][0].get<std::string>());
        EXPECT_EQ(h.metadata[i].second, want["metadata"][i][1].get<std::string>());
      }
    }
  }
}

TEST(SafetensorsHeader, FormattingWhatWasReadGivesSafetensorsOwnBytes) {
  ZCKPT_REQUIRE_TORCH();
  nlohmann::json manifest = Manifest();
  for (const auto& [file, want] : manifest.items()) {
    SCOPED_TRACE(file);
    auto bytes = ReadFileBytes(FixtureDir() + "/" + file);
    Header h = ParseFile(bytes, file);
    // safetensors writes the header in byte-buffer order: what the reader sorted into.
    std::string again = FormatHeader(h.tensors, h.has_metadata, h.metadata);
    EXPECT_EQ(again, std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(h.header_bytes)));
  }
}

TEST(SafetensorsHeader, WriterOrderIsSafetensorsLayout) {
  ZCKPT_REQUIRE_TORCH();
  // every_dtype.safetensors has one tensor of each dtype: safetensors laid them out by its
  // dtype order, which WriterOrder must reproduce.
  auto bytes = ReadFileBytes(FixtureDir() + "/every_dtype.safetensors");
  Header h = ParseFile(bytes, "every_dtype");
  std::vector<TensorEntry> sorted = h.tensors;
  std::stable_sort(sorted.begin(), sorted.end(), WriterOrder);
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i].name, h.tensors[i].name) << i;
  auto big = ReadFileBytes(FixtureDir() + "/big.safetensors");
  Header b = ParseFile(big, "big");
  sorted = b.tensors;
  std::stable_sort(sorted.begin(), sorted.end(), WriterOrder);
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i].name, b.tensors[i].name) << i;  // layer.10 before layer.2
}

TEST(SafetensorsHeader, TorchShapeOfF4HalvesTheLastDimension) {
  ZCKPT_REQUIRE_TORCH();
  auto bytes = ReadFileBytes(FixtureDir() + "/every_dtype.safetensors");
  Header h = ParseFile(bytes, "every_dtype");
  bool seen = false;
  for (const TensorEntry& t : h.tensors) {
    if (std::string(t.dtype.name) != "F4") continue;
    seen = true;
    EXPECT_EQ(t.dtype.dtype, DType::kFloat4_e2m1fn_x2);
    EXPECT_EQ(t.shape, (std::vector<uint64_t>{3, 4}));  // torch's [3, 2] of float4_e2m1fn_x2
    EXPECT_EQ(t.TorchShape(), (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(t.bytes(), 6u);
  }
  EXPECT_TRUE(seen);
}

TEST(SafetensorsHeader, LooksLikeSafetensors) {
  ZCKPT_REQUIRE_TORCH();
  auto bytes = ReadFileBytes(FixtureDir() + "/scalar.safetensors");
  EXPECT_TRUE(LooksLikeSafetensors(bytes, bytes.size()));
  EXPECT_FALSE(LooksLikeSafetensors(std::span<const uint8_t>(bytes).subspan(0, 8), bytes.size()));
  EXPECT_FALSE(LooksLikeSafetensors(bytes, 20));  // header length past the end
  std::vector<uint8_t> zip = {'P', 'K', 3, 4, 0, 0, 0, 0, '{'};
  EXPECT_FALSE(LooksLikeSafetensors(zip, 1 << 20));
}

}  // namespace
}  // namespace zckpt::safetensors
