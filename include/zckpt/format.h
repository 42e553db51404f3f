// The on-disk structures of the .zckpt container, one struct per table of
// format-spec/zckpt-v1.md, as decoded native values (what Container hands out), and the
// format's constants. The byte codec (Encode*/Decode*) is the format layer's own:
// src/format/record_codec.h.
#pragma once

#include <cstdint>
#include <string_view>

namespace zckpt::format {

inline constexpr uint16_t kMajorVersion = 1;
inline constexpr uint16_t kMinorVersion = 1;  // the newest minor this implementation reads and writes
// The blob holding the checkpoint's object pickle (spec §5.4).
inline constexpr std::string_view kObjectPickleBlob = "data.pkl";

inline constexpr uint8_t kSuperblockMagic[8] = {0x89, 'Z', 'C', 'K', '\r', '\n', 0x1A, '\n'};
inline constexpr uint8_t kFooterMagic[8] = {'Z', 'C', 'K', 'P', 'T', 'E', 'N', 'D'};
inline constexpr uint8_t kIndexMagic[4] = {'Z', 'I', 'D', 'X'};

inline constexpr uint64_t kSuperblockBytes = 64;
inline constexpr uint64_t kFooterBytes = 64;
inline constexpr uint64_t kIndexHeaderBytes = 16;
inline constexpr uint64_t kTableDescriptorBytes = 32;
// Where the checksums sit: the superblock's covers [0, 56), the footer's [0, 48).
inline constexpr uint64_t kSuperblockChecksumOffset = 56;
inline constexpr uint64_t kFooterChecksumOffset = 48;
inline constexpr uint64_t kFooterMagicOffset = 56;

// Defaults written by zckpt (the spec allows other values within the stated ranges).
inline constexpr uint64_t kDefaultChunkBytes = 4ull << 20;
inline constexpr uint32_t kDefaultLargeAlignment = 4096;
inline constexpr uint32_t kDefaultSmallAlignment = 64;
inline constexpr uint64_t kDefaultLargeThreshold = 64ull << 10;
inline constexpr uint64_t kMinChunkBytes = 4096;
inline constexpr uint64_t kMaxChunkBytes = 1ull << 30;
inline constexpr uint32_t kMaxAlignment = 1u << 20;
inline constexpr uint32_t kMaxTensorDims = 64;

// Superblock flags: bits 0-15 required, 16-31 optional. None are defined in 1.0.
inline constexpr uint32_t kRequiredFlagsMask = 0x0000FFFFu;
inline constexpr uint32_t kKnownRequiredFlags = 0;

enum class TableId : uint32_t {
  kStorages = 1,
  kChunks = 2,
  kTensors = 3,
  kDims = 4,
  kBlobs = 5,
  kMetadata = 6,
  kStrings = 7,
};
inline constexpr uint32_t kTableCount = 7;
// Minimum record size of each table; files may have longer records (§9).
inline constexpr uint32_t kStorageRecordBytes = 64;
inline constexpr uint32_t kChunkRecordBytes = 48;
inline constexpr uint32_t kTensorRecordBytes = 64;
inline constexpr uint32_t kDimRecordBytes = 8;
inline constexpr uint32_t kBlobRecordBytes = 32;
inline constexpr uint32_t kMetadataRecordBytes = 16;
inline constexpr uint32_t kStringRecordBytes = 1;
// The same, by table (index = id - 1).
inline constexpr uint32_t kRecordBytes[kTableCount] = {kStorageRecordBytes, kChunkRecordBytes, kTensorRecordBytes,
                                                       kDimRecordBytes, kBlobRecordBytes, kMetadataRecordBytes,
                                                       kStringRecordBytes};

enum class Codec : uint8_t { kNone = 0, kZstd = 1 };

// Storage flags.
inline constexpr uint16_t kStorageUntyped = 1u << 0;
inline constexpr uint16_t kKnownStorageFlags = kStorageUntyped;

// Tensor flags.
inline constexpr uint32_t kTensorRequiresGrad = 1u << 0;
inline constexpr uint32_t kTensorParameter = 1u << 1;
inline constexpr uint32_t kTensorConj = 1u << 2;
inline constexpr uint32_t kTensorNeg = 1u << 3;
inline constexpr uint32_t kTensorDTensorLocal = 1u << 4;
inline constexpr uint32_t kTensorShardedLocal = 1u << 5;
inline constexpr uint32_t kTensorQuantized = 1u << 6;
// A tensor inside another object's metadata (the DeviceMesh of a DTensor), not a state entry:
// kept so every storage is described, skipped by name matching (load_into's unexpected names).
inline constexpr uint32_t kTensorInternal = 1u << 7;
inline constexpr uint32_t kKnownTensorFlags = (1u << 8) - 1;

struct StringRef {
  uint32_t offset = 0;
  uint32_t length = 0;
};

struct Superblock {
  uint16_t major = kMajorVersion;
  uint16_t minor = kMinorVersion;
  uint32_t flags = 0;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  uint32_t large_alignment = kDefaultLargeAlignment;
  uint32_t small_alignment = kDefaultSmallAlignment;
  uint64_t large_threshold = kDefaultLargeThreshold;
};

struct Footer {
  uint64_t index_offset = 0;
  uint64_t index_bytes = 0;
  uint64_t index_checksum = 0;
  uint64_t file_bytes = 0;
  uint16_t major = kMajorVersion;
  uint16_t minor = kMinorVersion;
};

struct IndexHeader {
  uint32_t table_count = kTableCount;
};

struct TableDescriptor {
  uint32_t table_id = 0;
  uint32_t record_bytes = 0;
  uint64_t count = 0;
  uint64_t offset = 0;  // relative to the index start
  uint64_t bytes = 0;
};

struct StorageRecord {
  uint64_t raw_bytes = 0;
  uint64_t first_chunk = 0;
  uint64_t chunk_count = 0;
  StringRef key;
  StringRef location;
  uint16_t dtype = 0;
  uint16_t flags = 0;
};

struct ChunkRecord {
  uint64_t offset = 0;
  uint64_t stored_bytes = 0;
  uint64_t raw_bytes = 0;
  uint64_t stored_checksum = 0;
  uint64_t raw_checksum = 0;
  uint32_t storage = 0;
  uint8_t codec = 0;
};

inline bool IsZstd(const ChunkRecord& r) { return r.codec == static_cast<uint8_t>(Codec::kZstd); }

struct TensorRecord {
  StringRef name;
  uint32_t storage = 0;
  uint16_t dtype = 0;
  uint16_t ndim = 0;
  uint64_t storage_offset = 0;
  uint64_t dims = 0;
  uint32_t flags = 0;
  StringRef extra;
};

struct BlobRecord {
  StringRef name;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

struct MetadataRecord {
  StringRef key;
  StringRef value;
};

// XXH3-64, seed 0, as the spec defines "checksum".
uint64_t Checksum(const void* data, uint64_t size);
// Which kernel XXH3 runs on this machine: "avx512", "avx2", "sse2" (xxHash's dispatcher's
// choice, as CPUID tells it), "neon" (AArch64, chosen at compile time) or "portable" (no
// dispatcher in this build). For benchmark reports.
const char* ChecksumKernel();

}  // namespace zckpt::format
