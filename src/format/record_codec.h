// The byte codec of format-spec/zckpt-v1.md §3-§5: Encode*/Decode* move the structs of
// zckpt/format.h to and from the little-endian bytes of the file, field by field. Decoding never
// validates (it cannot fail): validation needs context (file size, other tables) and lives in
// the reader (container_validate.cc). Internal to the format layer and its tests.
#pragma once

#include <cstdint>

#include "zckpt/format.h"

namespace zckpt::format {

// Encoders write exactly the record's spec size (reserved bytes zeroed); the Superblock and
// Footer encoders also fill in their checksum and magic.
void EncodeSuperblock(const Superblock& s, uint8_t out[kSuperblockBytes]);
void EncodeFooter(const Footer& f, uint8_t out[kFooterBytes]);
void EncodeIndexHeader(const IndexHeader& h, uint8_t out[kIndexHeaderBytes]);
void EncodeTableDescriptor(const TableDescriptor& d, uint8_t out[kTableDescriptorBytes]);
void EncodeStorageRecord(const StorageRecord& r, uint8_t out[kStorageRecordBytes]);
void EncodeChunkRecord(const ChunkRecord& r, uint8_t out[kChunkRecordBytes]);
void EncodeTensorRecord(const TensorRecord& r, uint8_t out[kTensorRecordBytes]);
void EncodeBlobRecord(const BlobRecord& r, uint8_t out[kBlobRecordBytes]);
void EncodeMetadataRecord(const MetadataRecord& r, uint8_t out[kMetadataRecordBytes]);

// Decoders read the known prefix of a record; they do not check magic, checksums or reserved
// bytes (the reader does, with the file's context).
Superblock DecodeSuperblock(const uint8_t in[kSuperblockBytes]);
Footer DecodeFooter(const uint8_t in[kFooterBytes]);
IndexHeader DecodeIndexHeader(const uint8_t in[kIndexHeaderBytes]);
TableDescriptor DecodeTableDescriptor(const uint8_t in[kTableDescriptorBytes]);
// The record decoders read the first k*RecordBytes bytes at `in` (a file's records may be
// longer: §9).
StorageRecord DecodeStorageRecord(const uint8_t* in);
ChunkRecord DecodeChunkRecord(const uint8_t* in);
TensorRecord DecodeTensorRecord(const uint8_t* in);
BlobRecord DecodeBlobRecord(const uint8_t* in);
MetadataRecord DecodeMetadataRecord(const uint8_t* in);

}  // namespace zckpt::format
