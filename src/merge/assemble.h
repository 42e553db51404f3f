// Putting a full tensor together from its pieces (pieces.h).
#pragma once

#include <cstdint>
#include <set>

#include "merge/pieces.h"

namespace zckpt::merge {

// Checks, before anything is read, that the pieces tile `t` exactly: every piece of t's dtype
// and rank, every box inside t, identical boxes (replicas: Replicate placements, the ranks of a
// replica group) kept once, the others pairwise disjoint and together exactly t's elements.
// Error(kCorrupt) naming the tensor and the offending pieces.
void Tile(FullTensor& t);

class Assembler {
 public:
  // Reads every piece of `t` into `dst` (t.bytes() bytes, row-major, contiguous). A piece saved
  // contiguously streams chunk by chunk into its rows; a strided one is read whole first.
  void Assemble(const FullTensor& t, uint8_t* dst);
  // The elements of one saved view, row-major, into `dst` (numel x itemsize bytes).
  void Read(const SavedView& v, uint8_t* dst);

 private:
  void Stream(const SavedView& v, uint64_t begin, uint64_t end, uint8_t* dst_base,
              const std::vector<int64_t>& full_shape, const std::vector<int64_t>& offsets);
  std::set<const uint8_t*> crc_checked_;  // file storages whose CRC-32 has been checked
};

}  // namespace zckpt::merge
