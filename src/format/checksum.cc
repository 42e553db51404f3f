// format::Checksum (spec §1) and which XXH3 kernel computes it (format/xxh3.h).
#include "format/xxh3.h"
#include "zckpt/format.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace zckpt::format {

uint64_t Checksum(const void* data, uint64_t size) { return XXH3_64bits(data, static_cast<size_t>(size)); }

const char* ChecksumKernel() {
#if defined(ZCKPT_XXH3_DISPATCH) && ZCKPT_XXH3_DISPATCH && (defined(__x86_64__) || defined(__i386__))
  // xxh_x86dispatch.c's own test, in its order: CPUID's XSAVE and OSXSAVE, then leaf 7's
  // AVX-512F or AVX2 bit with XGETBV saying the OS saves those registers (ZMM and YMM, or YMM).
  // Not __builtin_cpu_supports: it reads what a runtime constructor fills in, which the wheel's
  // runtime (zig's) leaves empty: it would say "sse2" on every CPU.
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (bit_XSAVE | bit_OSXSAVE)) != (bit_XSAVE | bit_OSXSAVE)) return "sse2";
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));  // XGETBV 0
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "sse2";
  constexpr unsigned kYmm = (1u << 2) | (1u << 1), kZmm = (7u << 5) | kYmm;  // XCR0: SSE, AVX, opmask and ZMM state
  if ((b & bit_AVX512F) && (xcr0_lo & kZmm) == kZmm) return "avx512";
  if ((b & bit_AVX2) && (xcr0_lo & kYmm) == kYmm) return "avx2";
  return "sse2";
#elif defined(__aarch64__) && defined(__ARM_NEON)
  // xxHash has no dispatcher on AArch64: xxhash.c picks its NEON kernel at compile time whenever
  // the compiler defines __ARM_NEON, which every AArch64 compiler does (Advanced SIMD is
  // mandatory in ARMv8-A), so libxxhash built with its defaults (Debian's, the wheel's) runs it.
  return "neon";
#else
  return "portable";
#endif
}

}  // namespace zckpt::format
