// Little-endian loads/stores and overflow-checked arithmetic for the byte-format layer.
//
// Loads assemble bytes one by one: no alignment or aliasing assumptions about the mapping (a
// record may sit at any offset of a forged file), and the compiler still emits a single load on
// little-endian hosts.
#pragma once

#include <cstdint>

namespace zckpt::format::internal {

inline uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline uint32_t Load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
inline uint64_t Load64(const uint8_t* p) {
  return static_cast<uint64_t>(Load32(p)) | static_cast<uint64_t>(Load32(p + 4)) << 32;
}

inline void Store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void Store32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void Store64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// False on overflow (then *out is unspecified).
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
// align(x, a) of the spec, `a` a power of two; false when the result does not fit in 64 bits.
inline bool CheckedAlign(uint64_t x, uint64_t a, uint64_t* out) {
  if (!CheckedAdd(x, a - 1, out)) return false;
  *out &= ~(a - 1);
  return true;
}
// For values known not to overflow (writer-side sizes bounded by what was written).
inline uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }
inline bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// True when every byte of [p, p+n) is zero.
bool AllZero(const uint8_t* p, uint64_t n);
// Offset of the first nonzero byte of [p, p+n), or n when all are zero.
uint64_t FirstNonZero(const uint8_t* p, uint64_t n);

}  // namespace zckpt::format::internal
