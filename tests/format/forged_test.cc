// Forged index and header values, each re-sealed (checksums recomputed) so that only the
// structural rule under test can refuse the file (spec §7 steps 1-4), plus the version rules
// of §9 (higher minor, longer records, unknown tables, flags).
#include <gtest/gtest.h>

#include <cstring>

#include "format/bytes.h"
#include "format/record_codec.h"
#include "format_test_util.h"

namespace zckpt::testing {
namespace {

using format::TableId;
using format::internal::Load32;
using format::internal::Load64;

// SmallContainer's layout: storages 0 "0" (one zstd chunk), 1 "1" (200 raw bytes), 2 "2"
// (empty), 3 "3" (24 bytes); chunks 0, 1, 2; tensors w, w.T, bytes, odd, empty, scalar; blobs
// data.pkl (37 bytes), empty; two metadata entries.
class Forged : public ::testing::Test {
 protected:
  Forger f{SmallContainer()};

  uint8_t* storage(uint64_t i) { return f.record(TableId::kStorages, i); }
  uint8_t* chunk(uint64_t i) { return f.record(TableId::kChunks, i); }
  uint8_t* tensor(uint64_t i) { return f.record(TableId::kTensors, i); }
  uint8_t* blob(uint64_t i) { return f.record(TableId::kBlobs, i); }
  uint8_t* meta(uint64_t i) { return f.record(TableId::kMetadata, i); }
  uint8_t* dim(uint64_t i) { return f.record(TableId::kDims, i); }

  void ExpectRefused(ErrorKind kind, const std::string& needle) {
    OpenResult r = OpenAndVerify(f.Reseal());
    ASSERT_FALSE(r.opened) << "expected refusal containing '" << needle << "'";
    EXPECT_EQ(r.kind, kind) << r.message;
    EXPECT_NE(r.message.find(needle), std::string::npos) << r.message;
    EXPECT_EQ(r.message.rfind("mem.zckpt: ", 0), 0u) << r.message;
  }
  void ExpectCorrupt(const std::string& needle) { ExpectRefused(ErrorKind::kCorrupt, needle); }
  void ExpectGood() {
    OpenResult r = OpenAndVerify(f.Reseal());
    ASSERT_TRUE(r.opened) << r.message;
    for (const auto& p : r.report.problems) ADD_FAILURE() << p.message;
  }
};

TEST_F(Forged, Unchanged) { ExpectGood(); }

// --- superblock (step 1) and versions (§9) ---

TEST_F(Forged, MajorTwoIsUnsupported) {
  f.Set16(f.superblock() + 8, 2);
  ExpectRefused(ErrorKind::kUnsupported, "format version 2.0");
}

TEST_F(Forged, UnknownRequiredFlagIsUnsupported) {
  f.Set32(f.superblock() + 12, 1u << 3);
  ExpectRefused(ErrorKind::kUnsupported, "required feature flags 0x0008");
}

TEST_F(Forged, UnknownOptionalFlagOpens) {
  f.Set32(f.superblock() + 12, 1u << 20);
  ExpectGood();
}

TEST_F(Forged, HigherMinorOpens) {
  f.Set16(f.superblock() + 10, 5);
  f.Set16(f.footer() + 34, 5);
  ExpectGood();
  EXPECT_EQ(Container::OpenMemory(f.bytes().data(), f.bytes().size(), "m")->superblock().minor, 5);
}

TEST_F(Forged, FooterVersionDiffers) {
  f.Set16(f.superblock() + 10, 1);
  ExpectCorrupt("differs from the superblock's 1.1");
}

TEST_F(Forged, SuperblockParameters) {
  f.Set64(f.superblock() + 16, 4095);
  ExpectCorrupt("chunk_bytes must be");
}

TEST_F(Forged, LargeAlignmentNotDividingChunk) {
  f.Set32(f.superblock() + 24, 8192);
  ExpectCorrupt("large_alignment must divide");
}

TEST_F(Forged, SmallAlignmentAboveLarge) {
  f.Set32(f.superblock() + 28, 8192);
  ExpectCorrupt("small_alignment");
}

TEST_F(Forged, SuperblockReserved) {
  f.superblock()[47] = 1;
  ExpectCorrupt("superblock: reserved");
}

TEST_F(Forged, SuperblockChecksumNotResealed) {
  f.Reseal();
  f.superblock()[20] ^= 1;
  OpenResult r = OpenAndVerify(f.bytes());
  EXPECT_EQ(r.kind, ErrorKind::kCorrupt);
  EXPECT_NE(r.message.find("superblock checksum"), std::string::npos);
}

// --- footer (step 2) ---

TEST_F(Forged, WrongFileBytes) {
  f.Set64(f.footer() + 24, f.bytes().size() + 64);
  ExpectCorrupt("file_bytes");
}

TEST_F(Forged, IndexOffsetMisaligned) {
  f.Set64(f.footer(), f.index_offset() + 8);
  ExpectCorrupt("not a multiple of small_alignment");
}

TEST_F(Forged, IndexOffsetInSuperblock) {
  f.Set64(f.footer(), 0);
  ExpectCorrupt("inside the superblock");
}

TEST_F(Forged, IndexBytesOverflow) {
  f.Set64(f.footer() + 8, ~0ull - 10);
  ExpectCorrupt("does not end just before the footer");
}

TEST_F(Forged, IndexBytesTooSmall) {
  f.Set64(f.footer() + 8, 8);
  ExpectCorrupt("less than 16");
}

TEST_F(Forged, IndexEndsEarly) {
  f.Set64(f.footer() + 8, Load64(f.footer() + 8) - 64);
  ExpectCorrupt("does not end just before the footer");
}

TEST_F(Forged, FooterReserved) {
  f.footer()[40] = 9;
  ExpectCorrupt("footer: reserved");
}

TEST_F(Forged, PaddingBeforeFooter) {
  uint64_t end = f.index_offset() + Load64(f.footer() + 8);
  ASSERT_LT(end, f.bytes().size() - 64) << "SmallContainer should have padding after its index";
  f.bytes()[end] = 1;
  ExpectCorrupt("padding between the index and the footer");
}

// --- index header and descriptors (step 3) ---

TEST_F(Forged, IndexMagic) {
  f.index()[0] = 'X';
  ExpectCorrupt("ZIDX");
}

TEST_F(Forged, HugeTableCount) {
  f.Set32(f.index() + 4, 0xFFFFFFFFu);
  ExpectCorrupt("do not fit");
}

TEST_F(Forged, TooFewTables) {
  f.Set32(f.index() + 4, 6);
  ExpectCorrupt("less than 7");
}

TEST_F(Forged, IndexHeaderReserved) {
  f.index()[12] = 1;
  ExpectCorrupt("index header: reserved");
}

TEST_F(Forged, TableIdsOutOfOrder) {
  f.Set32(f.descriptor(1), 3);
  f.Set32(f.descriptor(2), 2);
  ExpectCorrupt("expected id 2");
}

TEST_F(Forged, RecordBytesTooSmall) {
  auto d = f.Descriptor(0);
  f.Set32(f.descriptor(0) + 4, 63);
  f.Set64(f.descriptor(0) + 24, d.count * 63);
  ExpectCorrupt("record_bytes 63 is less than 64");
}

TEST_F(Forged, DimsRecordBytesMustBeEight) {
  auto d = f.Descriptor(3);
  f.Set32(f.descriptor(3) + 4, 16);
  f.Set64(f.descriptor(3) + 24, d.count * 16);
  ExpectCorrupt("must be 8");
}

TEST_F(Forged, CountTimesRecordBytesOverflows) {
  f.Set64(f.descriptor(1) + 8, 1ull << 60);
  f.Set64(f.descriptor(1) + 24, (1ull << 60) * 48);  // wraps: not count x record_bytes
  ExpectCorrupt("is not count");
}

TEST_F(Forged, HugeCountRunsPastIndex) {
  f.Set64(f.descriptor(2) + 8, 1ull << 40);
  f.Set64(f.descriptor(2) + 24, 64ull << 40);
  ExpectCorrupt("runs past the");
}

TEST_F(Forged, TableOffsetNotInLayout) {
  f.Set64(f.descriptor(4) + 16, f.Descriptor(4).offset + 8);
  ExpectCorrupt("is not where the layout puts the table");
}

TEST_F(Forged, TableOffsetPastIndex) {
  f.Set64(f.descriptor(6) + 16, 1ull << 40);
  ExpectCorrupt("is not where the layout puts");
}

TEST_F(Forged, LastTableShort) {
  auto d = f.Descriptor(6);
  f.Set64(f.descriptor(6) + 8, d.count - 1);
  f.Set64(f.descriptor(6) + 24, d.count - 1);
  ExpectCorrupt("the last table ends at");
}

// --- records (step 4) ---

TEST_F(Forged, StringRefPastPool) {
  uint64_t pool = f.Descriptor(6).count;
  f.Set32(storage(1) + 28, static_cast<uint32_t>(pool));
  ExpectCorrupt("storage record 1: key string");
}

TEST_F(Forged, StringRefOverflowingU32) {
  f.Set32(tensor(0), 0xFFFFFFFFu);
  f.Set32(tensor(0) + 4, 0xFFFFFFFFu);
  ExpectCorrupt("tensor record 0: name string");
}

TEST_F(Forged, EmptyStringWithOffset) {
  f.Set32(tensor(0) + 40, 3);  // extra: offset 3, length 0
  ExpectCorrupt("tensor record 0: extra string");
}

TEST_F(Forged, StorageBadDType) {
  f.Set16(storage(0) + 40, 0);
  ExpectCorrupt("storage record 0: invalid dtype code 0");
  f.Set16(storage(0) + 40, 47);  // bcomplex32 is a code of format 1.1, not of this 1.0 file
  ExpectCorrupt("storage record 0: invalid dtype code 47 in format 1.0");
}

// §6/§9: which dtype codes a file may use depends on its minor version.
TEST_F(Forged, DTypeCodesFollowTheMinorVersion) {
  auto minor = [&](uint16_t m) {
    f.Set16(f.superblock() + 10, m);
    f.Set16(f.footer() + 34, m);
  };
  // A bcomplex32 view (4 bytes per element) of the 8-byte storage of tensor 0: valid from 1.1.
  const uint16_t code = static_cast<uint16_t>(DType::kBComplex32);
  f.Set16(tensor(0) + 12, code);
  minor(0);
  ExpectCorrupt("tensor record 0: invalid dtype code 47 in format 1.0");
  minor(1);
  OpenResult r = OpenAndVerify(f.Reseal());
  // The wider elements may push the view past its storage; only the dtype rule is under test.
  if (!r.opened) EXPECT_EQ(r.message.find("dtype"), std::string::npos) << r.message;
  // A code past every known one: corrupt in a file of a known minor, unsupported (a newer
  // dtype) in a file of a newer minor.
  f.Set16(tensor(0) + 12, kMaxDTypeCode + 1);
  ExpectCorrupt("tensor record 0: invalid dtype code 48");
  minor(2);
  ExpectRefused(ErrorKind::kUnsupported, "dtype code 48 of format 1.2, newer than this reader (1.1)");
}

TEST_F(Forged, StorageUnknownFlags) {
  f.Set16(storage(1) + 42, 2);
  ExpectCorrupt("storage record 1: unknown flags");
}

TEST_F(Forged, UntypedStorageMustBeBytes) {
  f.Set16(storage(0) + 42, 1);
  ExpectCorrupt("untyped");
}

TEST_F(Forged, StorageReserved) {
  storage(2)[63] = 1;
  ExpectCorrupt("storage record 2: reserved");
}

TEST_F(Forged, StorageBytesNotMultipleOfDType) {
  f.Set16(storage(1) + 40, 12);  // 200 bytes of float32 is fine; 200 of complex128 is not
  f.Set16(storage(1) + 40, 16);
  ExpectCorrupt("not a multiple of the dtype's size");
}

TEST_F(Forged, ChunkCountWrong) {
  f.Set64(storage(1) + 16, 2);
  ExpectCorrupt("chunk_count 2 is not");
}

TEST_F(Forged, FirstChunkWrong) {
  f.Set64(storage(1) + 8, 0);
  ExpectCorrupt("first_chunk 0");
}

TEST_F(Forged, ChunkRangePastTable) {
  f.Set64(storage(3), 2 * 4096);
  f.Set64(storage(3) + 16, 2);
  ExpectCorrupt("run past the 3-record chunk table");
}

TEST_F(Forged, ChunksNotAccountedFor) {
  f.Set64(storage(3), 0);
  f.Set64(storage(3) + 16, 0);
  ExpectCorrupt("storages account for 2");
}

TEST_F(Forged, ChunkStorageField) {
  f.Set32(chunk(1) + 40, 0);
  ExpectCorrupt("chunk record 1: (chunk 0 of storage 1) storage field is 0");
}

TEST_F(Forged, BadCodec) {
  chunk(1)[44] = 2;
  ExpectCorrupt("unknown codec 2");
}

TEST_F(Forged, ChunkReserved) {
  chunk(2)[46] = 1;
  ExpectCorrupt("chunk record 2: (chunk 0 of storage 3) reserved");
}

TEST_F(Forged, ZstdNotSmaller) {
  ASSERT_EQ(chunk(0)[44], 1);
  f.Set64(chunk(0) + 8, 4096);
  ExpectCorrupt("zstd chunk with stored_bytes 4096");
}

TEST_F(Forged, ZstdEmpty) {
  f.Set64(chunk(0) + 8, 0);
  ExpectCorrupt("zstd chunk with stored_bytes 0");
}

TEST_F(Forged, RawStoredDiffers) {
  f.Set64(chunk(1) + 8, 199);
  ExpectCorrupt("stored_bytes != raw_bytes");
}

TEST_F(Forged, RawChecksumsDiffer) {
  f.Set64(chunk(1) + 32, Load64(chunk(1) + 32) ^ 1);
  ExpectCorrupt("stored_checksum != raw_checksum");
}

TEST_F(Forged, ChunkRawBytesWrong) {
  f.Set64(chunk(0) + 16, 4000);
  ExpectCorrupt("raw_bytes 4000 should be 4096");
}

TEST_F(Forged, MisalignedChunk) {
  f.Set64(chunk(1), Load64(chunk(1)) + 1);
  ExpectCorrupt("not a multiple of the storage's alignment 64");
}

TEST_F(Forged, OverlappingChunks) {
  f.Set64(chunk(1), Load64(chunk(0)));
  ExpectCorrupt("overlaps the previous chunk");
}

TEST_F(Forged, ChunkPastDataRegion) {
  f.Set64(chunk(2), f.index_offset());
  ExpectCorrupt("run past the data region");
}

TEST_F(Forged, ChunkOffsetOverflow) {
  f.Set64(chunk(2), ~0ull - 63);
  ExpectCorrupt("run past the data region");
}

TEST_F(Forged, ChunkInSuperblock) {
  f.Set64(chunk(0), 0);
  ExpectCorrupt("overlaps the previous chunk, which ends at 64");
}

TEST_F(Forged, TensorStorageMissing) {
  f.Set32(tensor(0) + 8, 99);
  ExpectCorrupt("tensor record 0: storage 99 does not exist");
}

TEST_F(Forged, TensorBadDType) {
  f.Set16(tensor(0) + 12, 0);
  ExpectCorrupt("tensor record 0: invalid dtype");
}

TEST_F(Forged, TensorNdim65) {
  f.Set16(tensor(0) + 14, 65);
  ExpectCorrupt("ndim 65 is more than 64");
}

TEST_F(Forged, TensorDimsPastTable) {
  f.Set64(tensor(5) + 24, f.Descriptor(3).count);
  f.Set16(tensor(5) + 14, 1);
  ExpectCorrupt("tensor record 5: dims");
  f.Set64(tensor(5) + 24, ~0ull);
  ExpectCorrupt("tensor record 5: dims");
}

TEST_F(Forged, TensorNegativeSize) {
  uint64_t d = Load64(tensor(0) + 24);
  f.Set64(dim(d), static_cast<uint64_t>(-1));
  ExpectCorrupt("tensor record 0: negative size");
}

TEST_F(Forged, TensorStrideTwoToThe63) {
  uint64_t d = Load64(tensor(0) + 24);
  f.Set64(dim(d + 2), 1ull << 63);  // as i64: negative
  ExpectCorrupt("tensor record 0: negative stride");
}

TEST_F(Forged, TensorExtentOverflows) {
  uint64_t d = Load64(tensor(0) + 24);
  f.Set64(dim(d + 2), 1ull << 62);
  ExpectCorrupt("tensor record 0: extent overflows");
}

TEST_F(Forged, TensorStorageOffsetOverflows) {
  f.Set64(tensor(5) + 16, ~0ull);
  ExpectCorrupt("tensor record 5: storage_offset x element size is more than 2^63 - 1");
}

TEST_F(Forged, TensorOffsetAtInt64Limit) {
  f.Set64(tensor(5) + 16, ((1ull << 63) - 1) / 8);  // the byte offset fits: the storage's end refuses it
  ExpectCorrupt("tensor record 5: extent [9223372036854775800, 9223372036854775808) is past the end of storage 3");
}

TEST_F(Forged, TensorExtentPastStorage) {
  f.Set64(tensor(0) + 16, 1);
  ExpectCorrupt("tensor record 0: extent [4, 4100) is past the end of storage 0 (4096 bytes)");
}

// Spec §5.3: a tensor without elements touches no bytes, so its storage_offset need not lie in
// its storage, but it is an int64_t to torch, which multiplies it by the element size.
TEST_F(Forged, EmptyTensorOffsetPastItsStorage) {
  f.Set64(tensor(4) + 16, ((1ull << 63) - 1) / 4);  // float32: the largest byte offset that fits
  ExpectGood();
}

TEST_F(Forged, EmptyTensorOffsetBeyondInt64) {
  for (uint64_t offset : {~0ull, 1ull << 63, (1ull << 61)}) {  // 2^61 x 4 bytes = 2^63
    Forger g{SmallContainer()};
    g.Set64(g.record(TableId::kTensors, 4) + 16, offset);
    OpenResult r = OpenAndVerify(g.Reseal());
    EXPECT_FALSE(r.opened) << offset;
    EXPECT_NE(r.message.find("tensor record 4: storage_offset x element size is more than 2^63 - 1"), std::string::npos)
        << r.message;
  }
}

// The sizes of an empty tensor other than its zero: torch computes numel and nbytes from them.
TEST_F(Forged, EmptyTensorSizesBeyondInt64) {
  // "empty" is [0, 4] at dims (sizes 0, 4; strides 4, 1): make the 4 into 2^61 (x 4 bytes = 2^63).
  uint64_t dims = Load64(tensor(4) + 24);
  f.Set64(dim(dims + 1), 1ull << 61);
  ExpectCorrupt("tensor record 4: sizes multiply to more than 2^63 - 1 bytes");
}

TEST_F(Forged, EmptyTensorLargestSizesOpen) {
  uint64_t dims = Load64(tensor(4) + 24);
  f.Set64(dim(dims + 1), (1ull << 61) - 1);
  f.Set64(dim(dims + 2), 1ull << 62);  // strides of an empty tensor are unconstrained (>= 0)
  ExpectGood();
}

TEST_F(Forged, StorageRawBytesBeyondInt64) {
  f.Set64(storage(2), 1ull << 63);  // the empty storage: raw_bytes is checked before its chunks
  ExpectCorrupt("storage record 2: raw_bytes 9223372036854775808 is more than 2^63 - 1");
}

TEST_F(Forged, TensorUnknownFlags) {
  f.Set32(tensor(1) + 32, 1u << 8);
  ExpectCorrupt("tensor record 1: unknown flags");
}

TEST_F(Forged, TensorReserved) {
  tensor(2)[37] = 1;
  ExpectCorrupt("tensor record 2: reserved");
  tensor(2)[37] = 0;
  tensor(2)[60] = 1;
  ExpectCorrupt("tensor record 2: reserved");
}

TEST_F(Forged, BlobMisaligned) {
  f.Set64(blob(0) + 8, Load64(blob(0) + 8) + 1);
  ExpectCorrupt("blob record 0: offset");
}

TEST_F(Forged, BlobPastDataRegion) {
  f.Set64(blob(0) + 8, f.index_offset());
  ExpectCorrupt("not inside the data region");
  f.Set64(blob(0) + 8, 64);
  f.Set64(blob(0) + 16, ~0ull);
  ExpectCorrupt("not inside the data region");
}

TEST_F(Forged, BlobOverlapsChunk) {
  f.Set64(blob(0) + 8, Load64(chunk(1)));
  ExpectCorrupt("blob record 0: overlaps chunk 1");
}

TEST_F(Forged, BlobOverlapsBlob) {
  f.Set64(blob(1) + 8, Load64(blob(0) + 8));
  f.Set64(blob(1) + 16, 8);
  ExpectCorrupt("overlaps another blob");
}

TEST_F(Forged, EmptyBlobWithOffset) {
  f.Set64(blob(1) + 8, 64);
  ExpectCorrupt("blob record 1: an empty blob must have offset 0");
}

TEST_F(Forged, MetadataRef) {
  f.Set32(meta(0) + 12, 1000000);
  ExpectCorrupt("metadata record 0: value string");
}

TEST_F(Forged, DuplicateNames) {
  std::memcpy(tensor(1), tensor(0), 8);
  ExpectCorrupt("duplicate tensor name 'w' (records 0 and 1)");
}

TEST_F(Forged, DuplicateStorageKey) {
  std::memcpy(storage(2) + 24, storage(3) + 24, 8);
  ExpectCorrupt("duplicate storage key '3'");
}

TEST_F(Forged, DuplicateBlobAndMetadata) {
  std::memcpy(blob(1), blob(0), 8);
  ExpectCorrupt("duplicate blob name 'data.pkl'");
}

TEST_F(Forged, DuplicateMetadataKey) {
  std::memcpy(meta(1), meta(0), 8);
  ExpectCorrupt("duplicate metadata key");
}

// --- §9: a later minor version's longer records and extra tables ---

// Rewrites the index with `extra` more bytes per record of tables 1, 2, 3, 5, 6 (filled with
// `fill`: fields a 1.0 reader must ignore) and an 8th table of `table8` bytes (id 9), with
// `pad` in the padding before it.
std::vector<uint8_t> Relayout(std::vector<uint8_t> bytes, uint32_t extra, uint8_t fill, std::vector<uint8_t> table8,
                              uint8_t pad) {
  Forger f(std::move(bytes));
  uint64_t index_offset = f.index_offset();
  std::vector<uint8_t> index(16 + 32 * 8, 0);
  std::memcpy(index.data(), f.index(), 16);
  f.Set32(index.data() + 4, 8);
  std::vector<format::TableDescriptor> ds;
  for (uint32_t i = 0; i < 7; ++i) ds.push_back(f.Descriptor(i));
  for (uint32_t i = 0; i < 8; ++i) {
    bool longer = i != 3 && i != 6 && i != 7;
    uint32_t rb = i == 7 ? 1 : ds[i].record_bytes + (longer ? extra : 0);
    uint64_t count = i == 7 ? table8.size() : ds[i].count;
    uint64_t offset = (index.size() + 7) / 8 * 8;
    index.resize(offset, pad);
    for (uint64_t r = 0; r < count; ++r) {
      if (i == 7) {
        index.push_back(table8[r]);
        continue;
      }
      const uint8_t* rec = f.index() + ds[i].offset + r * ds[i].record_bytes;
      index.insert(index.end(), rec, rec + ds[i].record_bytes);
      index.resize(index.size() + (rb - ds[i].record_bytes), fill);
    }
    format::TableDescriptor d{i == 7 ? 9u : i + 1, rb, count, offset, count * rb};
    format::EncodeTableDescriptor(d, index.data() + 16 + 32 * i);
  }
  std::vector<uint8_t> out(f.bytes().begin(), f.bytes().begin() + static_cast<long>(index_offset));
  out.insert(out.end(), index.begin(), index.end());
  out.resize((out.size() + 63) / 64 * 64 + 64, 0);
  format::Footer ft{index_offset, index.size(), format::Checksum(index.data(), index.size()), out.size(), 1, 1};
  format::EncodeFooter(ft, out.data() + out.size() - 64);
  Forger g(std::move(out));
  g.Set16(g.superblock() + 10, 1);  // minor 1
  return g.Reseal();
}

TEST(ForwardCompat, LongerRecordsAndUnknownTablesAreRead) {
  auto original = SmallContainer();
  auto a = Container::OpenMemory(original.data(), original.size(), "a");
  auto bytes = Relayout(original, 24, 0xAB, {1, 2, 3, 4, 5}, 0);
  auto b = Container::OpenMemory(bytes.data(), bytes.size(), "b");
  EXPECT_EQ(b->superblock().minor, 1);
  ASSERT_EQ(b->tensor_count(), a->tensor_count());
  for (uint32_t t = 0; t < a->tensor_count(); ++t) {
    EXPECT_EQ(b->tensor(t).name, a->tensor(t).name);
    EXPECT_EQ(b->tensor(t).shape, a->tensor(t).shape);
    EXPECT_EQ(b->tensor(t).byte_end, a->tensor(t).byte_end);
  }
  for (uint64_t i = 0; i < a->chunk_count(); ++i) EXPECT_EQ(b->chunk(i).stored_checksum, a->chunk(i).stored_checksum);
  EXPECT_EQ(b->FindMetadata("zckpt.source.format"), "zip");
  EXPECT_EQ(b->FindBlob("data.pkl")->bytes, 37u);
  EXPECT_TRUE(b->Verify().ok());
}

TEST(ForwardCompat, PaddingBeforeUnknownTableMustBeZero) {
  auto bytes = Relayout(SmallContainer(), 0, 0, {7}, 0);
  EXPECT_TRUE(OpenAndVerify(bytes).opened);
  bytes = Relayout(SmallContainer(), 0, 0, {7}, 0x5A);
  OpenResult r = OpenAndVerify(bytes);
  ASSERT_FALSE(r.opened);
  EXPECT_NE(r.message.find("table descriptor 7 (id 9): padding before the table is not zero"), std::string::npos)
      << r.message;
}

}  // namespace
}  // namespace zckpt::testing
