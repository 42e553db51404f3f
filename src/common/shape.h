// Shapes and strides, as torch computes them.
#pragma once

#include <cstdint>
#include <vector>

namespace zckpt {

// The strides of a contiguous (row-major) tensor of `shape`, in elements, as torch gives them:
// a dimension of size 0 or 1 counts as 1 for the dimensions before it (torch.empty(3, 0).stride()
// is (1, 1)).
inline std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    stride[i] = acc;
    acc *= shape[i] > 1 ? shape[i] : 1;
  }
  return stride;
}

}  // namespace zckpt
