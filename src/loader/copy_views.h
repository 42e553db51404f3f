// Copying views of a container's storages into existing tensors: the streaming half that
// LoadInto (whole tensor records, matched by name) and LoadRegions (boxes of tensor records, for
// torch.distributed.checkpoint) share. Only the chunks the views touch are read, each checked.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "loader/into_check.h"
#include "zckpt/container.h"
#include "zckpt/load_options.h"

namespace zckpt::loader {

struct ViewCopy {
  // Checked by the caller: a dense cpu/cuda tensor with storage whose sizes equal view.shape.
  at::Tensor target;
  // A view of one storage of the file: dtype, shape, stride, storage_offset and the byte range
  // [byte_begin, byte_end) it touches (empty when it has no elements).
  TensorInfo view;
};

struct ViewCopyReport {
  uint64_t copies = 0;  // views given (empty ones included)
  uint64_t direct = 0;  // streamed chunk by chunk straight into the target
  uint64_t staged = 0;  // through a host buffer of the view's byte range + copy_()
  LoadStats stats;      // every field; `seconds` counted from the caller's t0
};

// What the checks of into_check.h need to know of `target` (defined), the state entry `name`.
TargetFacts FactsOf(const std::string& name, const at::Tensor& target);

// Why `target` cannot be written in place at all (undefined, or into_check.h's TargetProblem),
// or "" when it can. `name` says whose target it is.
std::string TargetProblem(const std::string& name, const at::Tensor& target);

// The view's bytes are contiguous in element order and need no conj/neg fix-up.
bool SavedContiguous(const TensorInfo& t);

// Why the file's dtype `t.dtype` cannot go into `target`'s as is (element runs, regions): not in
// this torch, or into_check.h's DTypeProblem; "" when it can.
std::string DTypeProblem(const TensorInfo& t, const std::string& name, const at::Tensor& target);

// A saved view contiguous in its storage going to a contiguous target of the same dtype is read
// straight into the target; anything else (strided or offset views, conj/neg bits, non-contiguous
// targets, another dtype) stages the view's byte range in a host buffer and copy_()s it (which
// converts dtypes). Targets written directly get their version counters bumped.
ViewCopyReport CopyViews(const Container& c, std::vector<ViewCopy> copies, const LoadOptions& options,
                         std::chrono::steady_clock::time_point t0);

}  // namespace zckpt::loader
