// The checks of a load into existing tensors, before a byte moves: one home for LoadInto (C++,
// at::Tensor targets: load_into.cc) and Python's zckpt.load_into (torch tensors, through the
// core's "check_into" call: src/python/core_calls.cc), each describing its targets as
// TargetFacts. Nothing here knows torch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zckpt/container.h"

namespace zckpt::loader {

// What the checks need to know of one target tensor.
struct TargetFacts {
  std::string name;          // the state entry it stands for
  bool strided = true;       // a dense (strided) layout
  std::string device;        // as torch names it: "cpu", "cuda:0", "meta", ...
  bool has_storage = true;   // false for a wrapper subclass (DTensor) with no storage of its own
  std::string dtype;         // zckpt's name of its dtype (torch's: include/zckpt/dtype.h)
  std::vector<int64_t> shape;
};

// Why `target` cannot be written in place at all (not dense, not on cpu or cuda, no storage of
// its own), or "" when it can.
std::string TargetProblem(const TargetFacts& target);

// Why the file's tensor `t` cannot go into `target` byte for byte: quantized (its quantizer
// lives in the object pickle), or another dtype; "" when it can.
std::string DTypeProblem(const TensorInfo& t, const TargetFacts& target);

struct IntoMatch {
  std::vector<std::pair<size_t, uint32_t>> matched;  // (index in the targets, tensor index in the file)
  std::vector<std::string> missing;     // names of targets the file does not hold
  std::vector<std::string> unexpected;  // the file's tensors no target names (internal ones never)
};

// Matches `targets` to the file's tensors by name and checks every match (the target, its dtype,
// its shape) and, with `strict`, that the names agree both ways. Error(kInvalidArgument) listing
// every problem when there is any.
IntoMatch CheckInto(const Container& c, const std::vector<TargetFacts>& targets, bool strict);

}  // namespace zckpt::loader
