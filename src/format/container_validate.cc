// Spec §7 steps 1-3: superblock, footer, index header and table descriptors. Each check is
// written in the order of the spec so the first rule a file breaks is the one reported, and
// all arithmetic on file values is overflow-checked.
//
// Each structure is read once (pread) into private memory and checked there: the superblock and
// footer into local arrays decoded into superblock_/footer_, the index (with the padding up to
// the footer) into index_. Nothing later reads them from the file again, so a file rewritten
// after its checks cannot change what was checked.
#include <algorithm>
#include <cstring>
#include <string>

#include "common/mapped_file.h"
#include "format/bytes.h"
#include "format/record_codec.h"
#include "format/layout.h"
#include "zckpt/container.h"

namespace zckpt {

using namespace format;
using namespace format::internal;

namespace {

std::string Num(uint64_t v) { return std::to_string(v); }

}  // namespace

void Container::Validate() {
  ValidateSuperblock();
  ValidateFooter();
  ValidateIndex();
  ValidateStoragesAndChunks();
  ValidateTensors();
  ValidateBlobsAndMetadata();
  BuildLookups();
}

void Container::ValidateSuperblock() {
  uint64_t size = file_->size();
  uint8_t d[kSuperblockBytes] = {};
  file_->ReadAt(0, std::min<uint64_t>(size, kSuperblockBytes), d);
  if (size < 8 || std::memcmp(d, kSuperblockMagic, 8) != 0)
    Fail(ErrorKind::kNotContainer, "not a zckpt container (no superblock magic)");
  if (size < kSuperblockBytes + kFooterBytes)
    Fail(ErrorKind::kNotContainer, "too short for a zckpt container (" + Num(size) + " bytes, at least 128 needed)");
  if (size % 64 != 0) Fail(ErrorKind::kCorrupt, "size " + Num(size) + " is not a multiple of 64 (truncated?)");
  if (Load64(d + kSuperblockChecksumOffset) != Checksum(d, kSuperblockChecksumOffset))
    Fail(ErrorKind::kCorrupt, "superblock checksum mismatch");
  superblock_ = DecodeSuperblock(d);
  const Superblock& sb = superblock_;
  if (sb.major != kMajorVersion)
    Fail(ErrorKind::kUnsupported, "format version " + Num(sb.major) + "." + Num(sb.minor) +
                                      " (this build reads major version " + Num(kMajorVersion) + ")");
  uint32_t unknown = sb.flags & kRequiredFlagsMask & ~kKnownRequiredFlags;
  if (unknown != 0) Fail(ErrorKind::kUnsupported, "unknown required feature flags 0x" + [&] {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%04x", unknown);
    return std::string(buf);
  }());
  if (const char* why = SuperblockParameterError(sb.chunk_bytes, sb.large_alignment, sb.small_alignment))
    Fail(ErrorKind::kCorrupt, std::string("superblock: ") + why + " (chunk_bytes " + Num(sb.chunk_bytes) +
                                  ", large_alignment " + Num(sb.large_alignment) + ", small_alignment " +
                                  Num(sb.small_alignment) + ")");
  if (!AllZero(d + kSuperblockReserved.begin, kSuperblockReserved.end - kSuperblockReserved.begin))
    Fail(ErrorKind::kCorrupt, "superblock: reserved bytes [40, 56) are not zero");
}

void Container::ValidateFooter() {
  uint64_t size = file_->size();
  uint8_t f[kFooterBytes];
  file_->ReadAt(size - kFooterBytes, kFooterBytes, f);
  if (std::memcmp(f + kFooterMagicOffset, kFooterMagic, 8) != 0)
    Fail(ErrorKind::kCorrupt, "no footer magic at the end of the file (truncated or unfinished?)");
  if (Load64(f + kFooterChecksumOffset) != Checksum(f, kFooterChecksumOffset))
    Fail(ErrorKind::kCorrupt, "footer checksum mismatch");
  footer_ = DecodeFooter(f);
  const Footer& ft = footer_;
  if (ft.file_bytes != size)
    Fail(ErrorKind::kCorrupt, "footer: file_bytes is " + Num(ft.file_bytes) + " but the file has " + Num(size) +
                                  " bytes");
  if (ft.major != superblock_.major || ft.minor != superblock_.minor)
    Fail(ErrorKind::kCorrupt, "footer: version " + Num(ft.major) + "." + Num(ft.minor) +
                                  " differs from the superblock's " + Num(superblock_.major) + "." +
                                  Num(superblock_.minor));
  if (!AllZero(f + kFooterReserved.begin, kFooterReserved.end - kFooterReserved.begin))
    Fail(ErrorKind::kCorrupt, "footer: reserved bytes [36, 48) are not zero");
  if (ft.index_offset < kSuperblockBytes)
    Fail(ErrorKind::kCorrupt, "footer: index_offset " + Num(ft.index_offset) + " is inside the superblock");
  if (ft.index_offset % superblock_.small_alignment != 0)
    Fail(ErrorKind::kCorrupt, "footer: index_offset " + Num(ft.index_offset) +
                                  " is not a multiple of small_alignment " + Num(superblock_.small_alignment));
  if (ft.index_bytes < kIndexHeaderBytes)
    Fail(ErrorKind::kCorrupt, "footer: index_bytes " + Num(ft.index_bytes) + " is less than 16");
  uint64_t end, footer_at;
  if (!CheckedAdd(ft.index_offset, ft.index_bytes, &end) || !CheckedAlign(end, 64, &footer_at) ||
      footer_at != size - kFooterBytes)
    Fail(ErrorKind::kCorrupt, "footer: the index [" + Num(ft.index_offset) + ", +" + Num(ft.index_bytes) +
                                  ") does not end just before the footer at " + Num(size - kFooterBytes));
  // The index and the padding after it, in one read: bounded by the file size (checked above).
  index_.resize(footer_at - ft.index_offset);
  file_->ReadAt(ft.index_offset, index_.size(), index_.data());
  if (!AllZero(index_.data() + ft.index_bytes, footer_at - end))
    Fail(ErrorKind::kCorrupt, "padding between the index and the footer is not zero");
}

void Container::ValidateIndex() {
  const uint8_t* index = index_.data();
  const uint64_t n = footer_.index_bytes;
  if (Checksum(index, n) != footer_.index_checksum) Fail(ErrorKind::kCorrupt, "index checksum mismatch");
  if (std::memcmp(index, kIndexMagic, 4) != 0) Fail(ErrorKind::kCorrupt, "index: no ZIDX magic");
  uint32_t table_count = DecodeIndexHeader(index).table_count;
  if (!AllZero(index + kIndexHeaderReserved.begin, kIndexHeaderReserved.end - kIndexHeaderReserved.begin))
    Fail(ErrorKind::kCorrupt, "index header: reserved bytes [8, 16) are not zero");
  if (table_count < kTableCount)
    Fail(ErrorKind::kCorrupt, "index header: table_count " + Num(table_count) + " is less than 7");
  if (table_count > (n - kIndexHeaderBytes) / kTableDescriptorBytes)
    Fail(ErrorKind::kCorrupt, "index header: " + Num(table_count) + " table descriptors do not fit in the " +
                                  Num(n) + "-byte index");

  Table* known[kTableCount] = {&storages_, &chunks_, &tensors_, &dims_, &blobs_, &metadata_, &strings_};
  uint64_t prev_end = kIndexHeaderBytes + kTableDescriptorBytes * table_count;
  uint32_t prev_id = 0;
  for (uint32_t i = 0; i < table_count; ++i) {
    TableDescriptor t = DecodeTableDescriptor(index + kIndexHeaderBytes + kTableDescriptorBytes * i);
    std::string where = "table descriptor " + Num(i) + " (id " + Num(t.table_id) + "): ";
    if (i < kTableCount ? t.table_id != i + 1 : t.table_id <= prev_id)
      Fail(ErrorKind::kCorrupt, where + (i < kTableCount ? "expected id " + Num(i + 1) : "ids must increase"));
    prev_id = t.table_id;
    // Dims and strings are arrays of scalars, not records a later minor version can lengthen.
    bool exact = t.table_id == uint32_t(TableId::kDims) || t.table_id == uint32_t(TableId::kStrings);
    uint32_t min_bytes = i < kTableCount ? kRecordBytes[i] : 1;
    if (exact ? t.record_bytes != min_bytes : t.record_bytes < min_bytes)
      Fail(ErrorKind::kCorrupt, where + "record_bytes " + Num(t.record_bytes) + (exact ? " must be " : " is less than ") +
                                    Num(min_bytes));
    uint64_t bytes;
    if (!CheckedMul(t.count, t.record_bytes, &bytes) || bytes != t.bytes)
      Fail(ErrorKind::kCorrupt, where + "bytes " + Num(t.bytes) + " is not count " + Num(t.count) + " x record_bytes " +
                                    Num(t.record_bytes));
    uint64_t expected = AlignUp(prev_end, 8);  // prev_end <= n, so this cannot overflow
    if (t.offset != expected)
      Fail(ErrorKind::kCorrupt, where + "offset " + Num(t.offset) + " is not where the layout puts the table (" +
                                    Num(expected) + ")");
    if (expected > n || t.bytes > n - expected)
      Fail(ErrorKind::kCorrupt, where + "table [" + Num(t.offset) + ", +" + Num(t.bytes) + ") runs past the " +
                                    Num(n) + "-byte index");
    if (!AllZero(index + prev_end, expected - prev_end))
      Fail(ErrorKind::kCorrupt, where + "padding before the table is not zero");
    prev_end = expected + t.bytes;
    if (i < kTableCount) *known[i] = {t.offset, t.count, t.record_bytes};
  }
  if (prev_end != n)
    Fail(ErrorKind::kCorrupt, "index: the last table ends at " + Num(prev_end) + ", index_bytes is " + Num(n));
  // Storage, tensor, blob and metadata indices are u32 in records and in the API.
  const char* names[kTableCount] = {"storages", "chunks", "tensors", "dims", "blobs", "metadata", "strings"};
  for (uint32_t i : {0u, 2u, 4u, 5u})
    if (known[i]->count > UINT32_MAX)
      Fail(ErrorKind::kCorrupt, std::string("index: the ") + names[i] + " table has " + Num(known[i]->count) +
                                    " records, more than 2^32 - 1");
}

}  // namespace zckpt
