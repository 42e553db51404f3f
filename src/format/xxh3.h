// XXH3 as zckpt computes it: xxHash's runtime dispatch where the library has it.
//
// Debian's libxxhash is built with xxHash's own x86 dispatcher (xxh_x86dispatch.c): besides
// XXH3_64bits it exports XXH3_64bits_dispatch / XXH3_64bits_update_dispatch, which pick the
// scalar, SSE2, AVX2 or AVX-512 kernel once per process from CPUID. The plain entry points of
// that build are its portable fallback, and measured here they hash at ~2.3 GB/s per core
// where the AVX-512 kernel runs at ~40 GB/s on bytes in cache (tools/bench/xxh3_speed.c via
// `zckpt bench verify`). Every XXH3 zckpt computes goes through this header: with the dispatcher,
// xxh_x86dispatch.h turns XXH3_64bits and XXH3_64bits_update into their dispatching versions
// (reset and digest share the state layout, so the streaming API is unchanged). meson.build
// defines ZCKPT_XXH3_DISPATCH when the library exports them; elsewhere (another architecture, an
// xxHash built without the dispatcher) the plain functions are used, with the same results.
#pragma once

#include <xxhash.h>
#if defined(ZCKPT_XXH3_DISPATCH) && ZCKPT_XXH3_DISPATCH
#include <xxh_x86dispatch.h>
#endif

// Which kernel it runs: format::ChecksumKernel() (zckpt/format.h).
