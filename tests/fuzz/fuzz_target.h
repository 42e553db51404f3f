// The fuzz targets' bodies, callable from libFuzzer and from the hardening regression suite.
//
// Each tests/fuzz/fuzz_*.cc defines one body (a plain function) and, unless built with
// ZCKPT_FUZZ_NO_ENTRY, libFuzzer's LLVMFuzzerTestOneInput calling it. The regression suite
// (tests/hardening/fuzz_regression_test.cc) compiles all bodies into one gtest with
// ZCKPT_FUZZ_NO_ENTRY and replays the inputs under tests/fuzz/regressions/ through them, so
// every crash a fuzzer found stays fixed in ordinary (non-clang, non-fuzz) builds too.
//
// A body catches zckpt::Error only: any other exception escaping (std::bad_alloc from an
// unbounded allocation, std::out_of_range, ...) is a bug, and so is a broken invariant, which
// the body reports with FuzzCheck (prints and aborts, so libFuzzer saves the input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace zckpt::fuzz {

void FuzzContainer(const uint8_t* data, size_t size);
void FuzzPickle(const uint8_t* data, size_t size);
void FuzzPtArchive(const uint8_t* data, size_t size);
void FuzzConvert(const uint8_t* data, size_t size);

// fuzz_container's custom mutator (container_mutator.cc), usable outside libFuzzer too.
// ResealContainer recomputes the superblock checksum, the footer's file_bytes (set to `size`),
// index checksum (when the index range lies inside) and checksum. ResealContainerData first
// recomputes every chunk's stored and raw checksums (raw: zstd frames up to 1 MiB decoded) and
// every blob's checksum that it can locate in the (possibly mutated) index, so a mutant gets past
// every checksum to the structural and data rules behind them. MutateContainerField sets one
// field of one record (or of the superblock, or a string pool byte) to a boundary value; false
// when no index can be located. MutateContainer: 1 time in 16 `mutate_bytes` alone (checksum paths
// stay fuzzed), else a byte mutation (6 in 16) or a field mutation (9 in 16), then
// ResealContainerData.
void ResealContainer(uint8_t* data, size_t size);
void ResealContainerData(uint8_t* data, size_t size);
bool MutateContainerField(uint8_t* data, size_t size, uint64_t seed);
size_t MutateContainer(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                       size_t (*mutate_bytes)(uint8_t*, size_t, size_t));

// Sizes above this are not decoded by the targets (a forged chunk may claim up to 1 GiB of raw
// bytes legitimately; allocating that per input would only measure the allocator).
inline constexpr uint64_t kMaxDecodeBytes = 16ull << 20;

[[noreturn]] inline void FuzzFail(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: fuzz invariant broken: %s\n", file, line, what);
  std::abort();
}

}  // namespace zckpt::fuzz

#define ZCKPT_FUZZ_CHECK(cond) \
  do {                         \
    if (!(cond)) ::zckpt::fuzz::FuzzFail(__FILE__, __LINE__, #cond); \
  } while (0)

#ifdef ZCKPT_FUZZ_NO_ENTRY
#define ZCKPT_FUZZ_ENTRY(body)
#else
#define ZCKPT_FUZZ_ENTRY(body)                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {      \
    body(data, size);                                                            \
    return 0;                                                                    \
  }
#endif
