// Spec §7 step 4: every record of the seven tables, then the uniqueness rules and the lookup
// vectors built from them. After this, every accessor of Container is infallible.
#include <algorithm>
#include <string>

#include "format/bytes.h"
#include "format/record_codec.h"
#include "format/layout.h"
#include "zckpt/container.h"

namespace zckpt {

using namespace format;
using namespace format::internal;

namespace {

std::string Num(uint64_t v) { return std::to_string(v); }

std::string Where(const char* table, uint64_t i) { return std::string(table) + " record " + Num(i) + ": "; }

// Spec §6 and §9: a record's dtype must be a code of the file's own minor version. A code past
// every one this reader knows, in a file of a newer minor, is unsupported (a newer dtype), not
// corrupt. Returns "" when the code is fine.
std::string DTypeProblem(uint16_t code, uint16_t minor, ErrorKind* kind) {
  *kind = ErrorKind::kCorrupt;
  if (code >= 1 && code <= MaxDTypeCodeOfMinor(minor)) return "";
  std::string version = "format 1." + Num(minor);
  if (code > kMaxDTypeCode && minor > kMinorVersion) {
    *kind = ErrorKind::kUnsupported;
    return "dtype code " + Num(code) + " of " + version + ", newer than this reader (1." + Num(kMinorVersion) + ")";
  }
  return "invalid dtype code " + Num(code) + (IsValidDType(code) ? " in " + version : "");
}

}  // namespace

void Container::ValidateStringRef(StringRef ref, const char* table, uint64_t record, const char* field) const {
  if (ref.length == 0 ? ref.offset != 0 : uint64_t{ref.offset} + ref.length > strings_.count)
    Fail(ErrorKind::kCorrupt, Where(table, record) + field + " string [" + Num(ref.offset) + ", +" + Num(ref.length) +
                                  ") is not in the " + Num(strings_.count) + "-byte string pool");
}

void Container::ValidateStoragesAndChunks() {
  const Superblock& sb = superblock_;
  const uint64_t data_end = footer_.index_offset;
  uint64_t next_chunk = 0;
  uint64_t prev_end = kSuperblockBytes;  // end of the previous chunk in the file
  for (uint64_t s = 0; s < storages_.count; ++s) {
    const uint8_t* rec = Record(storages_, s);
    StorageRecord r = DecodeStorageRecord(rec);
    auto fail = [&](const std::string& why) { Fail(ErrorKind::kCorrupt, Where("storage", s) + why); };
    ValidateStringRef(r.key, "storage", s, "key");
    ValidateStringRef(r.location, "storage", s, "location");
    ErrorKind kind;
    if (std::string why = DTypeProblem(r.dtype, sb.minor, &kind); !why.empty()) Fail(kind, Where("storage", s) + why);
    if (r.flags & ~kKnownStorageFlags) fail("unknown flags " + Num(r.flags));
    if ((r.flags & kStorageUntyped) && r.dtype != uint16_t(DType::kUInt8)) fail("an untyped storage must have dtype uint8");
    if (!AllZero(rec + kStorageReserved.begin, kStorageReserved.end - kStorageReserved.begin))
      fail("reserved bytes are not zero");
    if (r.raw_bytes > kMaxInt64) fail("raw_bytes " + Num(r.raw_bytes) + " is more than 2^63 - 1");
    if (r.raw_bytes % DTypeSize(static_cast<DType>(r.dtype)) != 0)
      fail("raw_bytes " + Num(r.raw_bytes) + " is not a multiple of the dtype's size");
    if (r.chunk_count != ChunkCount(r.raw_bytes, sb.chunk_bytes))
      fail("chunk_count " + Num(r.chunk_count) + " is not ceil(raw_bytes / chunk_bytes) = " +
           Num(ChunkCount(r.raw_bytes, sb.chunk_bytes)));
    if (r.first_chunk != next_chunk)
      fail("first_chunk " + Num(r.first_chunk) + " does not follow the previous storage's chunks (" + Num(next_chunk) +
           ")");
    if (r.chunk_count > chunks_.count - next_chunk)
      fail("chunks [" + Num(r.first_chunk) + ", +" + Num(r.chunk_count) + ") run past the " + Num(chunks_.count) +
           "-record chunk table");
    const uint32_t alignment = StorageAlignment(sb, r.raw_bytes);
    for (uint64_t k = 0; k < r.chunk_count; ++k) {
      const uint64_t i = next_chunk + k;
      const uint8_t* crec = Record(chunks_, i);
      ChunkRecord c = DecodeChunkRecord(crec);
      auto cfail = [&](const std::string& why) {
        Fail(ErrorKind::kCorrupt, Where("chunk", i) + "(chunk " + Num(k) + " of storage " + Num(s) + ") " + why);
      };
      if (c.storage != s) cfail("storage field is " + Num(c.storage));
      if (c.codec > uint8_t(Codec::kZstd)) cfail("unknown codec " + Num(c.codec));
      if (!AllZero(crec + kChunkReserved.begin, kChunkReserved.end - kChunkReserved.begin))
        cfail("reserved bytes are not zero");
      uint64_t raw = ChunkRawBytes(r.raw_bytes, sb.chunk_bytes, k);
      if (c.raw_bytes != raw) cfail("raw_bytes " + Num(c.raw_bytes) + " should be " + Num(raw));
      if (c.codec == uint8_t(Codec::kNone)) {
        if (c.stored_bytes != c.raw_bytes) cfail("codec none with stored_bytes != raw_bytes");
        if (c.stored_checksum != c.raw_checksum) cfail("codec none with stored_checksum != raw_checksum");
      } else if (c.stored_bytes == 0 || c.stored_bytes >= c.raw_bytes) {
        cfail("zstd chunk with stored_bytes " + Num(c.stored_bytes) + " not in (0, raw_bytes)");
      }
      if (c.offset % alignment != 0)
        cfail("offset " + Num(c.offset) + " is not a multiple of the storage's alignment " + Num(alignment));
      // Inside a storage each chunk follows the previous one at the next aligned offset, so
      // all-raw storages are contiguous; between storages any aligned gap is allowed.
      uint64_t expected_min = k == 0 ? prev_end : AlignUp(prev_end, alignment);
      if (k == 0 ? c.offset < expected_min : c.offset != expected_min)
        cfail("offset " + Num(c.offset) + (k == 0 ? " overlaps the previous chunk, which ends at " : " should be ") +
              Num(expected_min));
      if (c.offset > data_end || c.stored_bytes > data_end - c.offset)
        cfail("stored bytes [" + Num(c.offset) + ", +" + Num(c.stored_bytes) + ") run past the data region, which ends at " +
              Num(data_end));
      prev_end = c.offset + c.stored_bytes;
    }
    next_chunk += r.chunk_count;
  }
  if (next_chunk != chunks_.count)
    Fail(ErrorKind::kCorrupt, "chunk table has " + Num(chunks_.count) + " records, storages account for " + Num(next_chunk));
}

void Container::ValidateTensors() {
  for (uint64_t t = 0; t < tensors_.count; ++t) {
    const uint8_t* rec = Record(tensors_, t);
    TensorRecord r = DecodeTensorRecord(rec);
    auto fail = [&](const std::string& why) { Fail(ErrorKind::kCorrupt, Where("tensor", t) + why); };
    ValidateStringRef(r.name, "tensor", t, "name");
    ValidateStringRef(r.extra, "tensor", t, "extra");
    if (r.storage >= storages_.count) fail("storage " + Num(r.storage) + " does not exist");
    ErrorKind kind;
    if (std::string why = DTypeProblem(r.dtype, superblock_.minor, &kind); !why.empty()) Fail(kind, Where("tensor", t) + why);
    if (r.ndim > kMaxTensorDims) fail("ndim " + Num(r.ndim) + " is more than 64");
    if (r.flags & ~kKnownTensorFlags) fail("unknown flags " + Num(r.flags));
    for (ByteRange b : kTensorReserved)
      if (!AllZero(rec + b.begin, b.end - b.begin)) fail("reserved bytes are not zero");
    if (r.dims > dims_.count || 2u * r.ndim > dims_.count - r.dims)
      fail("dims [" + Num(r.dims) + ", +" + Num(2u * r.ndim) + ") run past the " + Num(dims_.count) + "-entry dims table");
    int64_t sizes[kMaxTensorDims], strides[kMaxTensorDims];
    for (uint32_t d = 0; d < r.ndim; ++d) {
      sizes[d] = Dim(r.dims + d);
      strides[d] = Dim(r.dims + r.ndim + d);
    }
    TensorExtent e = ComputeTensorExtent(r.storage_offset, sizes, strides, r.ndim, DTypeSize(DType(r.dtype)));
    if (e.error) fail(e.error);
    uint64_t raw = DecodeStorageRecord(Record(storages_, r.storage)).raw_bytes;
    if (e.end > raw)
      fail("extent [" + Num(e.begin) + ", " + Num(e.end) + ") is past the end of storage " + Num(r.storage) + " (" +
           Num(raw) + " bytes)");
  }
}

void Container::ValidateBlobsAndMetadata() {
  const uint64_t data_end = footer_.index_offset;
  std::vector<uint32_t> by_offset;
  for (uint64_t b = 0; b < blobs_.count; ++b) {
    BlobRecord r = DecodeBlobRecord(Record(blobs_, b));
    auto fail = [&](const std::string& why) { Fail(ErrorKind::kCorrupt, Where("blob", b) + why); };
    ValidateStringRef(r.name, "blob", b, "name");
    if (r.bytes == 0) {
      if (r.offset != 0) fail("an empty blob must have offset 0");
      continue;
    }
    if (r.offset % superblock_.small_alignment != 0)
      fail("offset " + Num(r.offset) + " is not a multiple of small_alignment");
    if (r.offset < kSuperblockBytes || r.offset > data_end || r.bytes > data_end - r.offset)
      fail("bytes [" + Num(r.offset) + ", +" + Num(r.bytes) + ") are not inside the data region [64, " + Num(data_end) + ")");
    by_offset.push_back(static_cast<uint32_t>(b));
  }
  // No two non-empty blobs and no blob and chunk overlap: walk the blobs in offset order against
  // the chunks, whose offsets already increase along their table.
  auto blob_at = [&](uint32_t b) { return DecodeBlobRecord(Record(blobs_, b)); };
  std::sort(by_offset.begin(), by_offset.end(), [&](uint32_t a, uint32_t b) { return blob_at(a).offset < blob_at(b).offset; });
  uint64_t prev_blob_end = 0;
  uint64_t c = 0;  // first chunk ending after the current blob's start
  for (uint32_t b : by_offset) {
    BlobRecord r = blob_at(b);
    if (r.offset < prev_blob_end) Fail(ErrorKind::kCorrupt, Where("blob", b) + "overlaps another blob");
    prev_blob_end = r.offset + r.bytes;
    while (c < chunks_.count) {
      ChunkRecord ch = chunk(c);
      if (ch.offset + ch.stored_bytes > r.offset) break;
      ++c;
    }
    if (c < chunks_.count && chunk(c).offset < prev_blob_end)
      Fail(ErrorKind::kCorrupt, Where("blob", b) + "overlaps chunk " + Num(c));
  }
  for (uint64_t m = 0; m < metadata_.count; ++m) {
    MetadataRecord r = DecodeMetadataRecord(Record(metadata_, m));
    ValidateStringRef(r.key, "metadata", m, "key");
    ValidateStringRef(r.value, "metadata", m, "value");
  }
}

void Container::BuildLookups() {
  // Sorts record indices by name and refuses duplicates (spec: names and keys are unique).
  auto build = [&](std::vector<uint32_t>& order, uint64_t count, const char* what, auto name_of) {
    order.resize(count);
    for (uint64_t i = 0; i < count; ++i) order[i] = static_cast<uint32_t>(i);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      std::string_view na = name_of(a), nb = name_of(b);
      return na < nb || (na == nb && a < b);
    });
    for (uint64_t i = 1; i < count; ++i)
      if (name_of(order[i - 1]) == name_of(order[i]))
        Fail(ErrorKind::kCorrupt, std::string("duplicate ") + what + " '" + std::string(name_of(order[i])) + "' (records " +
                                      Num(order[i - 1]) + " and " + Num(order[i]) + ")");
  };
  build(storage_order_, storages_.count, "storage key",
        [&](uint32_t i) { return String(DecodeStorageRecord(Record(storages_, i)).key); });
  build(tensor_order_, tensors_.count, "tensor name",
        [&](uint32_t i) { return String(DecodeTensorRecord(Record(tensors_, i)).name); });
  build(blob_order_, blobs_.count, "blob name", [&](uint32_t i) { return String(DecodeBlobRecord(Record(blobs_, i)).name); });
  build(metadata_order_, metadata_.count, "metadata key",
        [&](uint32_t i) { return String(DecodeMetadataRecord(Record(metadata_, i)).key); });
  auto storage_of = [&](uint32_t t) { return DecodeTensorRecord(Record(tensors_, t)).storage; };
  tensors_by_storage_.resize(tensors_.count);
  for (uint64_t i = 0; i < tensors_.count; ++i) tensors_by_storage_[i] = static_cast<uint32_t>(i);
  std::stable_sort(tensors_by_storage_.begin(), tensors_by_storage_.end(),
                   [&](uint32_t a, uint32_t b) { return storage_of(a) < storage_of(b); });
}

}  // namespace zckpt
