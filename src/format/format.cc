// Encoding and decoding of the fixed-size structures of spec §3-§5, field by field at the
// offsets of the spec's tables.
#include "format/record_codec.h"

#include <cstring>

#include "format/bytes.h"

namespace zckpt::format {

using internal::Load16;
using internal::Load32;
using internal::Load64;
using internal::Store16;
using internal::Store32;
using internal::Store64;

namespace {

void StoreRef(uint8_t* p, StringRef r) {
  Store32(p, r.offset);
  Store32(p + 4, r.length);
}
StringRef LoadRef(const uint8_t* p) { return {Load32(p), Load32(p + 4)}; }

}  // namespace

void EncodeSuperblock(const Superblock& s, uint8_t out[kSuperblockBytes]) {
  std::memset(out, 0, kSuperblockBytes);
  std::memcpy(out, kSuperblockMagic, 8);
  Store16(out + 8, s.major);
  Store16(out + 10, s.minor);
  Store32(out + 12, s.flags);
  Store64(out + 16, s.chunk_bytes);
  Store32(out + 24, s.large_alignment);
  Store32(out + 28, s.small_alignment);
  Store64(out + 32, s.large_threshold);
  Store64(out + kSuperblockChecksumOffset, Checksum(out, kSuperblockChecksumOffset));
}

Superblock DecodeSuperblock(const uint8_t in[kSuperblockBytes]) {
  Superblock s;
  s.major = Load16(in + 8);
  s.minor = Load16(in + 10);
  s.flags = Load32(in + 12);
  s.chunk_bytes = Load64(in + 16);
  s.large_alignment = Load32(in + 24);
  s.small_alignment = Load32(in + 28);
  s.large_threshold = Load64(in + 32);
  return s;
}

void EncodeFooter(const Footer& f, uint8_t out[kFooterBytes]) {
  std::memset(out, 0, kFooterBytes);
  Store64(out, f.index_offset);
  Store64(out + 8, f.index_bytes);
  Store64(out + 16, f.index_checksum);
  Store64(out + 24, f.file_bytes);
  Store16(out + 32, f.major);
  Store16(out + 34, f.minor);
  Store64(out + kFooterChecksumOffset, Checksum(out, kFooterChecksumOffset));
  std::memcpy(out + kFooterMagicOffset, kFooterMagic, 8);
}

Footer DecodeFooter(const uint8_t in[kFooterBytes]) {
  Footer f;
  f.index_offset = Load64(in);
  f.index_bytes = Load64(in + 8);
  f.index_checksum = Load64(in + 16);
  f.file_bytes = Load64(in + 24);
  f.major = Load16(in + 32);
  f.minor = Load16(in + 34);
  return f;
}

void EncodeIndexHeader(const IndexHeader& h, uint8_t out[kIndexHeaderBytes]) {
  std::memset(out, 0, kIndexHeaderBytes);
  std::memcpy(out, kIndexMagic, 4);
  Store32(out + 4, h.table_count);
}

IndexHeader DecodeIndexHeader(const uint8_t in[kIndexHeaderBytes]) { return {Load32(in + 4)}; }

void EncodeTableDescriptor(const TableDescriptor& d, uint8_t out[kTableDescriptorBytes]) {
  Store32(out, d.table_id);
  Store32(out + 4, d.record_bytes);
  Store64(out + 8, d.count);
  Store64(out + 16, d.offset);
  Store64(out + 24, d.bytes);
}

TableDescriptor DecodeTableDescriptor(const uint8_t in[kTableDescriptorBytes]) {
  return {Load32(in), Load32(in + 4), Load64(in + 8), Load64(in + 16), Load64(in + 24)};
}

void EncodeStorageRecord(const StorageRecord& r, uint8_t out[kStorageRecordBytes]) {
  std::memset(out, 0, kStorageRecordBytes);
  Store64(out, r.raw_bytes);
  Store64(out + 8, r.first_chunk);
  Store64(out + 16, r.chunk_count);
  StoreRef(out + 24, r.key);
  StoreRef(out + 32, r.location);
  Store16(out + 40, r.dtype);
  Store16(out + 42, r.flags);
}

StorageRecord DecodeStorageRecord(const uint8_t* in) {
  StorageRecord r;
  r.raw_bytes = Load64(in);
  r.first_chunk = Load64(in + 8);
  r.chunk_count = Load64(in + 16);
  r.key = LoadRef(in + 24);
  r.location = LoadRef(in + 32);
  r.dtype = Load16(in + 40);
  r.flags = Load16(in + 42);
  return r;
}

void EncodeChunkRecord(const ChunkRecord& r, uint8_t out[kChunkRecordBytes]) {
  std::memset(out, 0, kChunkRecordBytes);
  Store64(out, r.offset);
  Store64(out + 8, r.stored_bytes);
  Store64(out + 16, r.raw_bytes);
  Store64(out + 24, r.stored_checksum);
  Store64(out + 32, r.raw_checksum);
  Store32(out + 40, r.storage);
  out[44] = r.codec;
}

ChunkRecord DecodeChunkRecord(const uint8_t* in) {
  ChunkRecord r;
  r.offset = Load64(in);
  r.stored_bytes = Load64(in + 8);
  r.raw_bytes = Load64(in + 16);
  r.stored_checksum = Load64(in + 24);
  r.raw_checksum = Load64(in + 32);
  r.storage = Load32(in + 40);
  r.codec = in[44];
  return r;
}

void EncodeTensorRecord(const TensorRecord& r, uint8_t out[kTensorRecordBytes]) {
  std::memset(out, 0, kTensorRecordBytes);
  StoreRef(out, r.name);
  Store32(out + 8, r.storage);
  Store16(out + 12, r.dtype);
  Store16(out + 14, r.ndim);
  Store64(out + 16, r.storage_offset);
  Store64(out + 24, r.dims);
  Store32(out + 32, r.flags);
  StoreRef(out + 40, r.extra);
}

TensorRecord DecodeTensorRecord(const uint8_t* in) {
  TensorRecord r;
  r.name = LoadRef(in);
  r.storage = Load32(in + 8);
  r.dtype = Load16(in + 12);
  r.ndim = Load16(in + 14);
  r.storage_offset = Load64(in + 16);
  r.dims = Load64(in + 24);
  r.flags = Load32(in + 32);
  r.extra = LoadRef(in + 40);
  return r;
}

void EncodeBlobRecord(const BlobRecord& r, uint8_t out[kBlobRecordBytes]) {
  StoreRef(out, r.name);
  Store64(out + 8, r.offset);
  Store64(out + 16, r.bytes);
  Store64(out + 24, r.checksum);
}

BlobRecord DecodeBlobRecord(const uint8_t* in) { return {LoadRef(in), Load64(in + 8), Load64(in + 16), Load64(in + 24)}; }

void EncodeMetadataRecord(const MetadataRecord& r, uint8_t out[kMetadataRecordBytes]) {
  StoreRef(out, r.key);
  StoreRef(out + 8, r.value);
}

MetadataRecord DecodeMetadataRecord(const uint8_t* in) { return {LoadRef(in), LoadRef(in + 8)}; }

}  // namespace zckpt::format
