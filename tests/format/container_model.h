// The test builder for hostile containers: a container decoded into plain values that a test edits
// at will (any field of any record of any table, the string pool, the data bytes of any chunk or
// blob, the superblock, the footer's version), then encoded back with every checksum recomputed
// (chunks' stored and raw XXH3, blobs', the superblock's, the index's, the footer's), so the
// result passes the checksum layer and only the rule under test can refuse it.
//
//   ContainerModel m = ContainerModel::Parse(SmallContainer());
//   m.tensors[4].storage_offset = 1ull << 63;        // a record field
//   m.SetChunkData(0, frame, Codec::kZstd, 8 << 30);  // a chunk's bytes and declared size
//   m.tensors[0].name = m.AddString("a\nb");          // a string
//   std::vector<uint8_t> file = m.Build();
//
// Build() lays the data out as a writer would (chunks in table order at their storage's
// alignment, then the blobs, then the index), unless told to keep the offsets in the records;
// `after_layout` edits run after layout and checksums, to forge those too.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "zckpt/format.h"

namespace zckpt::testing {

struct ContainerModel {
  format::Superblock superblock;
  uint16_t footer_major = format::kMajorVersion, footer_minor = format::kMinorVersion;
  std::vector<format::StorageRecord> storages;
  std::vector<format::ChunkRecord> chunks;
  std::vector<format::TensorRecord> tensors;
  std::vector<uint64_t> dims;  // i64 in the file: any u64 here, to forge negative values
  std::vector<format::BlobRecord> blobs;
  std::vector<format::MetadataRecord> metadata;
  std::vector<uint8_t> strings;
  std::vector<std::vector<uint8_t>> chunk_data;  // stored bytes, one per chunk record
  std::vector<std::vector<uint8_t>> blob_data;   // one per blob record

  // Decodes a file Container::OpenMemory accepts (throws zckpt::Error otherwise).
  static ContainerModel Parse(const std::vector<uint8_t>& file);

  // Appends `s` to the string pool (no deduplication) and returns its reference.
  format::StringRef AddString(std::string_view s);
  std::string_view String(format::StringRef ref) const;

  // Replaces chunk i's stored bytes; sets codec, stored_bytes and raw_bytes (checksums follow in
  // Build). The storage's raw_bytes is left alone: change it too for a consistent file.
  void SetChunkData(uint64_t i, std::vector<uint8_t> stored, format::Codec codec, uint64_t raw_bytes);

  struct BuildOptions {
    bool layout = true;             // recompute chunk/blob offsets, stored_bytes, blob bytes, index_offset
    bool data_checksums = true;     // recompute chunk stored/raw checksums and blob checksums from the data
    std::function<void(ContainerModel&)> after_layout;  // last edits, before encoding
  };
  std::vector<uint8_t> Build() const { return Build(BuildOptions{}); }
  std::vector<uint8_t> Build(const BuildOptions& options) const;
};

// A zstd frame of `raw` whose window is at least `window_log` (single segment when the window
// covers the content: the window then equals the content size).
std::vector<uint8_t> ZstdFrame(const std::vector<uint8_t>& raw, int level = 3, int window_log = 0);

}  // namespace zckpt::testing
