// Loading boxes of saved tensors into existing tensors (libzckpt, LibTorch): what a
// torch.distributed.checkpoint storage reader needs. A rank that resumes at another world size
// asks for the part of each saved shard that overlaps its own: LoadRegions reads only the chunks
// those parts touch, checks each, and writes the bytes straight into the targets.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "zckpt/load_options.h"

namespace zckpt {

struct Region {
  std::string tensor;            // name of a tensor record of the file
  std::vector<int64_t> offsets;  // where the box starts in each dimension of that tensor
  std::vector<int64_t> lengths;  // the box's size in each dimension: the target's shape
  at::Tensor target;             // cpu or cuda, any strides; another dtype is converted (copy_)
};

struct LoadRegionsReport {
  uint64_t regions = 0;
  uint64_t direct = 0;  // streamed chunk by chunk into the target (contiguous box and target)
  uint64_t staged = 0;  // through a host buffer of the box's byte extent + copy_()
  LoadStats stats;      // stats.stored_bytes: bytes of the chunks read, the measure of "only what is needed"
};

// Every region is checked before a byte moves (one Error(kInvalidArgument) listing each problem:
// an unknown tensor, a box outside the tensor, a target whose shape is not the box's, a target
// without storage of its own); then the chunks the boxes touch are streamed once, in file order.
// A corrupt chunk is Error(kCorrupt) naming the file, the storage, its tensors and the byte range
// (Container::DescribeChunk); targets may then be partially written.
LoadRegionsReport LoadRegions(const std::string& path, const std::vector<Region>& regions,
                              const LoadOptions& options = {});

}  // namespace zckpt
