// Checking mapped storages where they lie: Map's verify (include/zckpt/loader.h, MapOptions).
#pragma once

#include <cstdint>
#include <vector>

namespace zckpt {
class Container;
}

namespace zckpt::loader {

// Hashes the raw chunks `chunks` of `c` in a mapping of its whole file starting at `base` (a
// page boundary: mmap's address), on `threads` threads, against their stored XXH3.
// Error(kCorrupt) naming the chunk on a mismatch; Error(kIo) naming the file when a page of a
// chunk is gone (the file was truncated after it was opened): the hash reads the mapping under a
// SIGBUS guard (common/fault_guard.h), never dies of it.
void VerifyMapped(const Container& c, const uint8_t* base, const std::vector<uint64_t>& chunks, unsigned threads);

}  // namespace zckpt::loader
