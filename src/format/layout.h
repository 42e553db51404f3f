// Rules of format-spec/zckpt-v1.md that both the reader and the writer apply, so the writer can
// never produce a file the reader refuses: superblock parameters (§3), storage alignment and
// chunking (§3, §5.1-5.2), tensor extents (§5.3), and the reserved byte ranges of each record.
#pragma once

#include <cstdint>

#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::format::internal {

// nullptr when chunk_bytes, the alignments and the threshold satisfy §3, else the rule broken.
const char* SuperblockParameterError(uint64_t chunk_bytes, uint32_t large_alignment, uint32_t small_alignment);

// §3: large_alignment for storages of at least large_threshold bytes, small_alignment otherwise.
inline uint32_t StorageAlignment(const Superblock& sb, uint64_t raw_bytes) {
  return raw_bytes >= sb.large_threshold ? sb.large_alignment : sb.small_alignment;
}
// §5.1: ceil(raw_bytes / chunk_bytes), without overflow.
inline uint64_t ChunkCount(uint64_t raw_bytes, uint64_t chunk_bytes) {
  return raw_bytes / chunk_bytes + (raw_bytes % chunk_bytes != 0 ? 1 : 0);
}
// §5.2: raw size of chunk k (< ChunkCount) of a storage.
inline uint64_t ChunkRawBytes(uint64_t raw_bytes, uint64_t chunk_bytes, uint64_t k) {
  uint64_t begin = k * chunk_bytes;
  return raw_bytes - begin < chunk_bytes ? raw_bytes - begin : chunk_bytes;
}

// Largest value of an i64: what the u64 sizes and offsets of the file that readers hand to torch
// (as int64_t) may reach (§5.1, §5.3).
inline constexpr uint64_t kMaxInt64 = (uint64_t{1} << 63) - 1;

// §5.3: the byte range [begin, end) of its storage that a tensor touches, or the rule it breaks.
// Also for tensors without elements: storage_offset x element size, and the product of the
// nonzero sizes x element size, are at most kMaxInt64.
struct TensorExtent {
  const char* error = nullptr;  // nullptr when valid
  uint64_t begin = 0, end = 0;  // both 0 when the tensor has no elements
};
TensorExtent ComputeTensorExtent(uint64_t storage_offset, const int64_t* sizes, const int64_t* strides, uint32_t ndim,
                                 uint32_t itemsize);

// Reserved (must-be-zero) byte ranges inside each fixed-size structure.
inline constexpr ByteRange kSuperblockReserved = {40, 56};
inline constexpr ByteRange kFooterReserved = {36, 48};
inline constexpr ByteRange kIndexHeaderReserved = {8, 16};
inline constexpr ByteRange kStorageReserved = {44, 64};
inline constexpr ByteRange kChunkReserved = {45, 48};
inline constexpr ByteRange kTensorReserved[2] = {{36, 40}, {48, 64}};

}  // namespace zckpt::format::internal
