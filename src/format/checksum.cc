// format::Checksum (spec §1) and which XXH3 kernel computes it (format/xxh3.h).
#include "format/xxh3.h"
#include "zckpt/format.h"

namespace zckpt::format {

uint64_t Checksum(const void* data, uint64_t size) { return XXH3_64bits(data, static_cast<size_t>(size)); }

const char* ChecksumKernel() {
#if defined(ZCKPT_XXH3_DISPATCH) && ZCKPT_XXH3_DISPATCH && (defined(__x86_64__) || defined(__i386__))
  // The order xxh_x86dispatch.c prefers them; __builtin_cpu_supports also checks that the OS
  // saves the wide registers, as the dispatcher's XGETBV test does.
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2")) return "avx2";
  return "sse2";
#else
  return "portable";
#endif
}

}  // namespace zckpt::format
