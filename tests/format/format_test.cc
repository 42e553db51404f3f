// Encoding and decoding of every structure (spec §3-§5), the XXH3 vectors of spec §1, and the
// shared rules (superblock parameters, chunking, tensor extents).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "format/layout.h"
#include "format/record_codec.h"
#include "zckpt/format.h"

namespace zckpt::format {
namespace {

TEST(Checksum, SpecVectors) {
  EXPECT_EQ(Checksum("", 0), 0x2D06800538D394C2ull);
  EXPECT_EQ(Checksum("abc", 3), 0x78AF5F94892F3950ull);
}

TEST(Encode, SuperblockRoundTripAndLayout) {
  Superblock s;
  s.minor = 7;
  s.flags = 0x00010002;
  s.chunk_bytes = 1 << 20;
  s.large_alignment = 8192;
  s.small_alignment = 128;
  s.large_threshold = 12345;
  uint8_t b[kSuperblockBytes];
  std::memset(b, 0xEE, sizeof b);
  EncodeSuperblock(s, b);
  EXPECT_EQ(0, std::memcmp(b, kSuperblockMagic, 8));
  EXPECT_EQ(b[8], 1);  // major, little-endian
  EXPECT_EQ(b[10], 7);
  EXPECT_EQ(b[12], 2);
  EXPECT_EQ(b[14], 1);
  for (int i = 40; i < 56; ++i) EXPECT_EQ(b[i], 0) << i;
  uint64_t sum;
  std::memcpy(&sum, b + 56, 8);
  EXPECT_EQ(sum, Checksum(b, 56));
  Superblock d = DecodeSuperblock(b);
  EXPECT_EQ(d.major, 1);
  EXPECT_EQ(d.minor, 7);
  EXPECT_EQ(d.flags, s.flags);
  EXPECT_EQ(d.chunk_bytes, s.chunk_bytes);
  EXPECT_EQ(d.large_alignment, s.large_alignment);
  EXPECT_EQ(d.small_alignment, s.small_alignment);
  EXPECT_EQ(d.large_threshold, s.large_threshold);
}

TEST(Encode, FooterRoundTripAndLayout) {
  Footer f{4096, 300, 0x1122334455667788ull, 4480, 1, 3};
  uint8_t b[kFooterBytes];
  std::memset(b, 0xEE, sizeof b);
  EncodeFooter(f, b);
  EXPECT_EQ(0, std::memcmp(b + 56, "ZCKPTEND", 8));
  for (int i = 36; i < 48; ++i) EXPECT_EQ(b[i], 0) << i;
  EXPECT_EQ(b[16], 0x88);
  uint64_t sum;
  std::memcpy(&sum, b + 48, 8);
  EXPECT_EQ(sum, Checksum(b, 48));
  Footer d = DecodeFooter(b);
  EXPECT_EQ(d.index_offset, 4096u);
  EXPECT_EQ(d.index_bytes, 300u);
  EXPECT_EQ(d.index_checksum, f.index_checksum);
  EXPECT_EQ(d.file_bytes, 4480u);
  EXPECT_EQ(d.major, 1);
  EXPECT_EQ(d.minor, 3);
}

TEST(Encode, IndexHeaderAndDescriptor) {
  uint8_t h[kIndexHeaderBytes];
  std::memset(h, 0xEE, sizeof h);
  EncodeIndexHeader({9}, h);
  EXPECT_EQ(0, std::memcmp(h, "ZIDX", 4));
  EXPECT_EQ(DecodeIndexHeader(h).table_count, 9u);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(h[i], 0);
  TableDescriptor t{3, 64, 1ull << 40, 248, 64ull << 40};
  uint8_t b[kTableDescriptorBytes];
  EncodeTableDescriptor(t, b);
  TableDescriptor d = DecodeTableDescriptor(b);
  EXPECT_EQ(d.table_id, 3u);
  EXPECT_EQ(d.record_bytes, 64u);
  EXPECT_EQ(d.count, 1ull << 40);
  EXPECT_EQ(d.offset, 248u);
  EXPECT_EQ(d.bytes, 64ull << 40);
}

// Every field set to a distinct value that uses its full width, then decoded back.
TEST(Encode, RecordsRoundTrip) {
  uint8_t b[64];
  StorageRecord s{~0ull - 1, 1ull << 33, 77, {0xFFFFFFF0u, 9}, {3, 0xFFFFFFFFu}, 46, kStorageUntyped};
  std::memset(b, 0xEE, 64);
  EncodeStorageRecord(s, b);
  for (int i = 44; i < 64; ++i) EXPECT_EQ(b[i], 0);
  StorageRecord sd = DecodeStorageRecord(b);
  EXPECT_EQ(sd.raw_bytes, s.raw_bytes);
  EXPECT_EQ(sd.first_chunk, s.first_chunk);
  EXPECT_EQ(sd.chunk_count, s.chunk_count);
  EXPECT_EQ(sd.key.offset, s.key.offset);
  EXPECT_EQ(sd.key.length, s.key.length);
  EXPECT_EQ(sd.location.length, s.location.length);
  EXPECT_EQ(sd.dtype, 46);
  EXPECT_EQ(sd.flags, kStorageUntyped);

  ChunkRecord c{1ull << 50, 12, 4096, 0xAAAABBBBCCCCDDDDull, 0x1111222233334444ull, 0xFFFFFFFEu, 1};
  std::memset(b, 0xEE, 64);
  EncodeChunkRecord(c, b);
  for (int i = 45; i < 48; ++i) EXPECT_EQ(b[i], 0);
  EXPECT_EQ(b[48], 0xEE);  // writes exactly 48 bytes
  ChunkRecord cd = DecodeChunkRecord(b);
  EXPECT_EQ(cd.offset, c.offset);
  EXPECT_EQ(cd.stored_bytes, 12u);
  EXPECT_EQ(cd.raw_bytes, 4096u);
  EXPECT_EQ(cd.stored_checksum, c.stored_checksum);
  EXPECT_EQ(cd.raw_checksum, c.raw_checksum);
  EXPECT_EQ(cd.storage, c.storage);
  EXPECT_EQ(cd.codec, 1);

  TensorRecord t{{5, 6}, 0xFFFFFFFFu, 12, 64, 1ull << 62, 99, kKnownTensorFlags, {7, 8}};
  std::memset(b, 0xEE, 64);
  EncodeTensorRecord(t, b);
  for (int i : {36, 37, 38, 39, 48, 55, 63}) EXPECT_EQ(b[i], 0) << i;
  TensorRecord td = DecodeTensorRecord(b);
  EXPECT_EQ(td.name.offset, 5u);
  EXPECT_EQ(td.name.length, 6u);
  EXPECT_EQ(td.storage, t.storage);
  EXPECT_EQ(td.dtype, 12);
  EXPECT_EQ(td.ndim, 64);
  EXPECT_EQ(td.storage_offset, t.storage_offset);
  EXPECT_EQ(td.dims, 99u);
  EXPECT_EQ(td.flags, kKnownTensorFlags);
  EXPECT_EQ(td.extra.offset, 7u);
  EXPECT_EQ(td.extra.length, 8u);

  BlobRecord bl{{1, 2}, 4096, 1ull << 35, 0x0102030405060708ull};
  std::memset(b, 0xEE, 64);
  EncodeBlobRecord(bl, b);
  EXPECT_EQ(b[32], 0xEE);
  BlobRecord bd = DecodeBlobRecord(b);
  EXPECT_EQ(bd.name.length, 2u);
  EXPECT_EQ(bd.offset, 4096u);
  EXPECT_EQ(bd.bytes, 1ull << 35);
  EXPECT_EQ(bd.checksum, bl.checksum);

  MetadataRecord m{{10, 20}, {30, 40}};
  std::memset(b, 0xEE, 64);
  EncodeMetadataRecord(m, b);
  EXPECT_EQ(b[16], 0xEE);
  MetadataRecord md = DecodeMetadataRecord(b);
  EXPECT_EQ(md.key.offset, 10u);
  EXPECT_EQ(md.value.length, 40u);
}

// Decoding reads from any byte offset (records of a forged file need not be aligned).
TEST(Decode, UnalignedRecords) {
  alignas(8) uint8_t buf[80] = {};
  ChunkRecord c{4096, 4096, 4096, 5, 5, 3, 0};
  EncodeChunkRecord(c, buf + 3);
  EXPECT_EQ(DecodeChunkRecord(buf + 3).storage, 3u);
  EXPECT_EQ(DecodeChunkRecord(buf + 3).offset, 4096u);
}

TEST(Layout, SuperblockParameters) {
  using internal::SuperblockParameterError;
  EXPECT_EQ(SuperblockParameterError(4 << 20, 4096, 64), nullptr);
  EXPECT_EQ(SuperblockParameterError(4096, 4096, 4096), nullptr);
  EXPECT_EQ(SuperblockParameterError(1 << 30, 1 << 20, 64), nullptr);
  EXPECT_NE(SuperblockParameterError(0, 4096, 64), nullptr);
  EXPECT_NE(SuperblockParameterError(4095, 4096, 64), nullptr);
  EXPECT_NE(SuperblockParameterError(6000, 64, 64), nullptr);
  EXPECT_NE(SuperblockParameterError((1ull << 30) + 4096, 4096, 64), nullptr);
  EXPECT_NE(SuperblockParameterError(4096, 8192, 64), nullptr);   // does not divide chunk_bytes
  EXPECT_NE(SuperblockParameterError(4096, 32, 32), nullptr);     // below 64
  EXPECT_NE(SuperblockParameterError(4096, 3000, 64), nullptr);   // not a power of two
  EXPECT_NE(SuperblockParameterError(1 << 30, 1 << 21, 64), nullptr);
  EXPECT_NE(SuperblockParameterError(4096, 4096, 8192), nullptr);  // small > large
  EXPECT_NE(SuperblockParameterError(4096, 4096, 96), nullptr);
}

TEST(Layout, Chunking) {
  using internal::ChunkCount;
  using internal::ChunkRawBytes;
  EXPECT_EQ(ChunkCount(0, 4096), 0u);
  EXPECT_EQ(ChunkCount(1, 4096), 1u);
  EXPECT_EQ(ChunkCount(4096, 4096), 1u);
  EXPECT_EQ(ChunkCount(4097, 4096), 2u);
  EXPECT_EQ(ChunkCount(~0ull, 4096), (~0ull >> 12) + 1);
  EXPECT_EQ(ChunkRawBytes(4097, 4096, 0), 4096u);
  EXPECT_EQ(ChunkRawBytes(4097, 4096, 1), 1u);
  EXPECT_EQ(ChunkRawBytes(8192, 4096, 1), 4096u);
}

TEST(Layout, TensorExtent) {
  using internal::ComputeTensorExtent;
  int64_t sizes[] = {2, 3}, strides[] = {3, 1};
  auto e = ComputeTensorExtent(0, sizes, strides, 2, 4);
  EXPECT_EQ(e.error, nullptr);
  EXPECT_EQ(e.begin, 0u);
  EXPECT_EQ(e.end, 24u);
  e = ComputeTensorExtent(5, sizes, strides, 2, 2);  // offset in elements
  EXPECT_EQ(e.begin, 10u);
  EXPECT_EQ(e.end, 2u * (5 + 3 + 2 + 1));
  e = ComputeTensorExtent(7, nullptr, nullptr, 0, 8);  // 0-dim: one element
  EXPECT_EQ(e.begin, 56u);
  EXPECT_EQ(e.end, 64u);
  int64_t empty[] = {0, 5}, big[] = {1ll << 62, 1ll << 62};
  e = ComputeTensorExtent(((1ull << 63) - 1) / 8, empty, big, 2, 8);  // no elements: touches nothing
  EXPECT_EQ(e.error, nullptr);
  EXPECT_EQ(e.end, 0u);
  // ... but its offset and sizes are int64_t to torch, times the element size.
  EXPECT_NE(ComputeTensorExtent(~0ull, empty, big, 2, 8).error, nullptr);
  EXPECT_NE(ComputeTensorExtent(1ull << 60, empty, big, 2, 8).error, nullptr);  // 2^63 bytes
  int64_t empty_big[] = {1ll << 40, 0, (1ll << 23) - 1}, ones[] = {1, 1, 1};
  EXPECT_EQ(ComputeTensorExtent(0, empty_big, ones, 3, 1).error, nullptr);  // 2^63 - 2^40 bytes fit
  EXPECT_NE(ComputeTensorExtent(0, empty_big, ones, 3, 2).error, nullptr);  // twice that does not
  int64_t expanded[] = {1ll << 40, 1ll << 40}, zero_strides[] = {0, 0};  // one element, 2^80 of them
  EXPECT_NE(ComputeTensorExtent(0, expanded, zero_strides, 2, 1).error, nullptr);
  int64_t two[] = {2}, huge[] = {1ll << 62};
  EXPECT_NE(ComputeTensorExtent(0, two, huge, 1, 8).error, nullptr);  // (2^62 + 1) * 8 overflows
  int64_t max_stride[] = {std::numeric_limits<int64_t>::max()};
  EXPECT_EQ(ComputeTensorExtent(2, two, max_stride, 1, 1).end, (1ull << 63) + 2);  // fits
  EXPECT_NE(ComputeTensorExtent(2, two, max_stride, 1, 2).error, nullptr);
  EXPECT_NE(ComputeTensorExtent(~0ull, nullptr, nullptr, 0, 1).error, nullptr);
  int64_t neg[] = {-1};
  EXPECT_NE(ComputeTensorExtent(0, neg, two, 1, 1).error, nullptr);
  EXPECT_NE(ComputeTensorExtent(0, two, neg, 1, 1).error, nullptr);
  int64_t zero_stride[] = {0};
  e = ComputeTensorExtent(3, two, zero_stride, 1, 4);  // broadcast view
  EXPECT_EQ(e.end, 16u);
}

}  // namespace
}  // namespace zckpt::format
