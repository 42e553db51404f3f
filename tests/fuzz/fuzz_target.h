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

// Recomputes what a random mutation of a container breaks first, so a mutated input gets past
// the checksums to the structural rules behind them: the superblock checksum, the footer's
// file_bytes (set to `size`), index checksum (when the index range lies inside) and checksum.
// fuzz_container's custom mutator applies it to 7 mutations out of 8.
void ResealContainer(uint8_t* data, size_t size);

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
