// Damage that must never go unnoticed: every single-bit flip of a small container, every
// truncation, and bytes of another file.
#include <gtest/gtest.h>

#include "format_test_util.h"

namespace zckpt::testing {
namespace {

TEST(Corruption, SmallContainerIsValidAndCoversEveryKindOfByte) {
  auto bytes = SmallContainer();
  auto c = Container::OpenMemory(bytes.data(), bytes.size(), "small");
  EXPECT_LT(bytes.size(), 4096u);
  EXPECT_TRUE(c->Verify().ok());
  bool zstd = false, raw = false, gap = false;
  uint64_t end = format::kSuperblockBytes;
  for (uint64_t i = 0; i < c->chunk_count(); ++i) {
    auto ch = c->chunk(i);
    zstd |= ch.codec == 1;
    raw |= ch.codec == 0;
    gap |= ch.offset > end;
    end = ch.offset + ch.stored_bytes;
  }
  EXPECT_TRUE(zstd && raw && gap);
  EXPECT_EQ(c->storage(2).raw_bytes, 0u);
  EXPECT_GT(c->blob_count(), 0u);
  EXPECT_GT(c->metadata_count(), 0u);
  EXPECT_GT(c->footer().index_offset + c->footer().index_bytes, 0u);
}

// Every bit of the file, one at a time: open refuses it or Verify reports a problem.
TEST(Corruption, EverySingleBitFlipIsCaught) {
  auto bytes = SmallContainer();
  uint64_t refused_at_open = 0, found_by_verify = 0;
  for (size_t byte = 0; byte < bytes.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      bytes[byte] ^= static_cast<uint8_t>(1u << bit);
      OpenResult r = OpenAndVerify(bytes);
      bytes[byte] ^= static_cast<uint8_t>(1u << bit);
      if (!r.opened) {
        refused_at_open++;
        EXPECT_TRUE(r.kind == ErrorKind::kCorrupt || r.kind == ErrorKind::kNotContainer ||
                    r.kind == ErrorKind::kUnsupported)
            << r.message;
      } else if (!r.report.ok()) {
        found_by_verify++;
      } else {
        ADD_FAILURE() << "flip of bit " << bit << " of byte " << byte << " went unnoticed";
      }
    }
  }
  EXPECT_EQ(refused_at_open + found_by_verify, bytes.size() * 8);
  EXPECT_GT(found_by_verify, 0u);  // data-region flips reach Verify
  EXPECT_GT(refused_at_open, 0u);
}

TEST(Corruption, EveryTruncationIsRefused) {
  auto bytes = SmallContainer();
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      Container::OpenMemory(bytes.data(), n, "cut");
      ADD_FAILURE() << "truncation to " << n << " bytes opened";
    } catch (const Error& e) {
      ErrorKind want = n < 128 ? ErrorKind::kNotContainer : ErrorKind::kCorrupt;
      EXPECT_EQ(e.kind(), want) << n << ": " << e.what();
    }
  }
}

TEST(Corruption, AppendedBytesAreRefused) {
  auto bytes = SmallContainer();
  bytes.resize(bytes.size() + 64);
  EXPECT_FALSE(OpenAndVerify(bytes).opened);
}

TEST(Corruption, NotAContainer) {
  std::vector<uint8_t> zip = {'P', 'K', 3, 4};
  zip.resize(4096);
  OpenResult r = OpenAndVerify(zip);
  EXPECT_FALSE(r.opened);
  EXPECT_EQ(r.kind, ErrorKind::kNotContainer);
  EXPECT_NE(r.message.find("mem.zckpt"), std::string::npos) << r.message;
  r = OpenAndVerify({});
  EXPECT_EQ(r.kind, ErrorKind::kNotContainer);
  // A CRLF conversion breaks the magic.
  auto bytes = SmallContainer();
  bytes.insert(bytes.begin() + 5, '\r');
  bytes.resize(bytes.size() - 1);
  EXPECT_EQ(OpenAndVerify(bytes).kind, ErrorKind::kNotContainer);
}

TEST(Corruption, OpenMissingFileIsIo) {
  try {
    Container::Open("/nonexistent/x.zckpt");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
  }
}

}  // namespace
}  // namespace zckpt::testing
