// Writing the object pickle torch.save writes for a plain dict of tensors, for sources that
// have no pickle of their own (safetensors files): `data.pkl` of
//
//   torch.save({name: tensor, ...})   # each tensor contiguous, on the CPU, owning its storage
//
// byte for byte as torch 2.x writes it (protocol 2, the memo as Python's pickler fills it,
// _rebuild_tensor_v2 with a typed storage for the dtypes torch has a storage class for,
// _rebuild_tensor_v3 with an UntypedStorage and the dtype for the others). So a container made
// from such a source is the container `zckpt convert` makes from that torch.save file, and
// every reader of containers (zckpt.load, the C++ object tree, export to .pt) works unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zckpt/dtype.h"

namespace zckpt::pickle {

struct DictTensor {
  std::string name;         // the dict key
  std::string storage_key;  // its storage's key ("0", "1", ...: torch numbers them in dict order)
  DType dtype = DType::kInvalid;
  std::vector<int64_t> shape;  // contiguous; strides follow
};

// The pickle bytes; throws Error(kInvalidArgument) for a dtype torch cannot save, or a shape
// with a negative size or one whose element count overflows.
std::string TorchSavePickleOfTensorDict(const std::vector<DictTensor>& tensors);

}  // namespace zckpt::pickle
