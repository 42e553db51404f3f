// Loading parts of saved tensors into existing tensors (libzckpt, LibTorch), the one partial-load
// API: boxes, what a torch.distributed.checkpoint storage reader needs (a rank that resumes at
// another world size asks for the part of each saved shard that overlaps its own), and element
// runs, what an FSDP1 loader needs (a FlatParameter shard filled from per-parameter shards).
// LoadRegions reads only the chunks those parts touch, checks each, and writes the bytes
// straight into the targets.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zckpt/load_options.h"

namespace zckpt {

class Container;  // zckpt/container.h

struct Region {
  std::string tensor;            // name of a tensor record of the file
  std::vector<int64_t> offsets;  // where the box starts in each dimension of that tensor
  std::vector<int64_t> lengths;  // the box's size in each dimension: the target's shape
  at::Tensor target;             // cpu or cuda, any strides; another dtype is converted (copy_)
  // An element run instead of a box (ElementRun): elements [begin, begin + target.numel()) of
  // the tensor in row-major order, into a contiguous target of the same dtype and any shape; the
  // saved tensor must be contiguous in its storage. offsets and lengths are not used.
  bool elements = false;
  uint64_t begin = 0;
};

// The region of elements [begin, begin + target.numel()) of `tensor`.
inline Region ElementRun(std::string tensor, uint64_t begin, at::Tensor target) {
  Region r;
  r.tensor = std::move(tensor);
  r.target = std::move(target);
  r.elements = true;
  r.begin = begin;
  return r;
}

struct LoadRegionsReport {
  uint64_t regions = 0;
  uint64_t direct = 0;  // streamed chunk by chunk into the target (contiguous box and target)
  uint64_t staged = 0;  // through a host buffer of the box's byte extent + copy_()
  LoadStats stats;      // stats.stored_bytes: bytes of the chunks read, the measure of "only what is needed"
};

// Every region is checked before a byte moves (one Error(kInvalidArgument) listing each problem:
// a tensor not in the file, a box outside the tensor, a target whose shape is not the box's, a
// target without storage of its own; for element runs a run past the tensor's elements, another
// dtype, a saved tensor or a target that is not contiguous); then the chunks the regions touch
// are streamed once, in file order. Several regions may name one tensor.
// A corrupt chunk is Error(kCorrupt) naming the file, the storage, its tensors and the byte range
// (Container::DescribeChunk); targets may then be partially written.
LoadRegionsReport LoadRegions(const std::string& path, const std::vector<Region>& regions,
                              const LoadOptions& options = {});
// The same through an open container: the index, the pickle and every chunk come from that one
// open file, so a checkpoint renamed over its path meanwhile is never mixed in.
LoadRegionsReport LoadRegions(const Container& container, const std::vector<Region>& regions,
                              const LoadOptions& options = {});

}  // namespace zckpt
