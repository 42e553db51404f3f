// Putting a full tensor together from its pieces (pieces.h).
#pragma once

#include <cstdint>
#include <set>

#include "merge/pieces.h"

namespace zckpt::merge {

// Checks, before anything is read, that the pieces tile `t` exactly: every piece of t's dtype
// and rank, every box inside t, identical boxes (replicas: Replicate placements, the ranks of a
// replica group) kept once with the others as its `replicas` (compared when read), the others
// pairwise disjoint and together exactly t's elements. Error(kCorrupt) naming the tensor and the
// offending pieces.
void Tile(FullTensor& t);

class Assembler {
 public:
  // Reads every piece of `t` into `dst` (t.bytes() bytes, row-major, contiguous). A piece saved
  // contiguously streams chunk by chunk into its rows; a strided one is read whole first. A piece
  // with replicas is read whole, and so is each replica: bytes that differ are Error(kCorrupt)
  // naming both views and the tensor (pieces that neither tile nor are equal replicas), nothing
  // having been written (extra memory: twice the piece).
  void Assemble(const FullTensor& t, uint8_t* dst);
  // The elements of one saved view, row-major, into `dst` (numel x itemsize bytes).
  void Read(const SavedView& v, uint8_t* dst);

 private:
  void Place(const FullTensor& t, const Piece& p, uint8_t* dst);
  void Stream(const SavedView& v, uint64_t begin, uint64_t end, uint8_t* dst_base,
              const std::vector<int64_t>& full_shape, const std::vector<int64_t>& offsets);
  std::set<const uint8_t*> crc_checked_;  // file storages whose CRC-32 has been checked
};

}  // namespace zckpt::merge
