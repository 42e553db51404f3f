// format::Checksum and every streaming XXH3 in zckpt run xxHash's dispatched kernels
// (format/xxh3.h). They must give exactly the portable kernel's values -- the spec's checksum --
// for every length class XXH3 treats differently (0-16, 17-128, 129-240, long inputs with partial
// stripes and blocks), any alignment, and any split of a stream into pieces.
//
// Here XXH3_64bits is the library's portable entry point (XXH_DISPATCH_DISABLE_REPLACE), the
// reference the dispatched functions are compared with.
#include <gtest/gtest.h>
#include <xxhash.h>
#if defined(ZCKPT_XXH3_DISPATCH) && ZCKPT_XXH3_DISPATCH
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define ZCKPT_TEST_UPDATE XXH3_64bits_update_dispatch
#else
#define ZCKPT_TEST_UPDATE XXH3_64bits_update
#endif

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "zckpt/format.h"

namespace zckpt::format {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Checksum, DispatchedEqualsPortableForEveryLengthClassAndAlignment) {
  std::vector<uint8_t> data = RandomBytes((1 << 20) + 64, 7);
  for (size_t len : {0ul, 1ul, 3ul, 4ul, 8ul, 9ul, 16ul, 17ul, 128ul, 129ul, 240ul, 241ul, 1023ul, 1024ul, 1025ul,
                     4096ul, 65535ul, 65536ul + 7, 1ul << 20}) {
    for (size_t misalign : {0ul, 1ul, 7ul, 31ul, 63ul}) {
      const uint8_t* p = data.data() + misalign;
      EXPECT_EQ(Checksum(p, len), XXH3_64bits(p, len)) << "len " << len << " misalign " << misalign;
    }
  }
}

// The loader and the verifier feed the dispatched streaming update chunks in pieces (512 KiB, 1 MiB, a zstd window): the digest
// must not depend on where the pieces end.
TEST(Checksum, StreamedInAnyPiecesEqualsOneShot) {
  std::vector<uint8_t> data = RandomBytes(3 << 20, 11);
  const uint64_t want = XXH3_64bits(data.data(), data.size());
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    XXH3_state_t* s = XXH3_createState();
    ASSERT_NE(s, nullptr);
    XXH3_64bits_reset(s);
    for (size_t at = 0; at < data.size();) {
      size_t n = std::min<size_t>(data.size() - at, trial == 0 ? 512 << 10 : 1 + rng() % (700 << 10));
      ZCKPT_TEST_UPDATE(s, data.data() + at, n);
      at += n;
    }
    EXPECT_EQ(XXH3_64bits_digest(s), want);
    XXH3_freeState(s);
  }
}

// On an x86 CPU with AVX2 this build must be using a vector kernel: the portable one costs
// ~10x more CPU per verified byte (src/format/xxh3.h).
TEST(Checksum, KernelMatchesTheCpu) {
  std::string kernel = ChecksumKernel();
#if defined(__x86_64__) && defined(ZCKPT_XXH3_DISPATCH) && ZCKPT_XXH3_DISPATCH
  if (__builtin_cpu_supports("avx512f"))
    EXPECT_EQ(kernel, "avx512");
  else if (__builtin_cpu_supports("avx2"))
    EXPECT_EQ(kernel, "avx2");
  else
    EXPECT_EQ(kernel, "sse2");
#elif defined(__aarch64__)
  EXPECT_EQ(kernel, "neon");
#else
  EXPECT_EQ(kernel, "portable");
#endif
}

}  // namespace
}  // namespace zckpt::format
