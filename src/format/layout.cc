#include "format/layout.h"

#include <cstring>

#include "format/bytes.h"

namespace zckpt::format::internal {

const char* SuperblockParameterError(uint64_t chunk_bytes, uint32_t large_alignment, uint32_t small_alignment) {
  if (chunk_bytes < kMinChunkBytes || chunk_bytes > kMaxChunkBytes || chunk_bytes % kMinChunkBytes != 0)
    return "chunk_bytes must be a multiple of 4096 in [4096, 2^30]";
  if (!IsPowerOfTwo(large_alignment) || large_alignment < 64 || large_alignment > kMaxAlignment)
    return "large_alignment must be a power of two in [64, 2^20]";
  if (chunk_bytes % large_alignment != 0) return "large_alignment must divide chunk_bytes";
  if (!IsPowerOfTwo(small_alignment) || small_alignment < 64 || small_alignment > large_alignment)
    return "small_alignment must be a power of two in [64, large_alignment]";
  return nullptr;
}

TensorExtent ComputeTensorExtent(uint64_t storage_offset, const int64_t* sizes, const int64_t* strides, uint32_t ndim,
                                 uint32_t itemsize) {
  TensorExtent r;
  bool empty = false;
  // torch holds these values as int64_t and multiplies them by the element size (data_ptr,
  // nbytes, set_'s bounds check), also for a tensor without elements: refuse what would overflow
  // there, so no reader ever turns a u64 of the file into a negative int64.
  uint64_t nominal = itemsize;  // product of the nonzero sizes, times the element size
  for (uint32_t i = 0; i < ndim; ++i) {
    if (sizes[i] < 0) return {"negative size", 0, 0};
    if (strides[i] < 0) return {"negative stride", 0, 0};
    if (sizes[i] == 0) empty = true;
    else if (!CheckedMul(nominal, static_cast<uint64_t>(sizes[i]), &nominal) || nominal > kMaxInt64)
      return {"sizes multiply to more than 2^63 - 1 bytes", 0, 0};
  }
  uint64_t offset_bytes;
  if (!CheckedMul(storage_offset, itemsize, &offset_bytes) || offset_bytes > kMaxInt64)
    return {"storage_offset x element size is more than 2^63 - 1", 0, 0};
  if (empty) return r;  // touches no bytes, whatever its offset and strides say
  // Largest element index: storage_offset + sum (size_i - 1) * stride_i, then bytes past it.
  uint64_t last = storage_offset;
  for (uint32_t i = 0; i < ndim; ++i) {
    uint64_t step;
    if (!CheckedMul(static_cast<uint64_t>(sizes[i]) - 1, static_cast<uint64_t>(strides[i]), &step) ||
        !CheckedAdd(last, step, &last))
      return {"extent overflows 64 bits", 0, 0};
  }
  if (!CheckedAdd(last, 1, &r.end) || !CheckedMul(r.end, itemsize, &r.end))
    return {"extent overflows 64 bits", 0, 0};
  r.begin = offset_bytes;  // <= end
  return r;
}

bool AllZero(const uint8_t* p, uint64_t n) {
  // OR-reduce 64-bit words: the verifier's padding scan runs at memory bandwidth.
  uint64_t acc = 0, i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t w[8];
    std::memcpy(w, p + i, 64);
    acc |= w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7];
    if (acc != 0) return false;
  }
  for (; i < n; ++i) acc |= p[i];
  return acc == 0;
}

uint64_t FirstNonZero(const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != 0) return i;
  return n;
}

}  // namespace zckpt::format::internal
