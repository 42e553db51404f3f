// Pickles shaped as torch.save writes them, built in C++ for tests that write containers with
// ContainerWriter: an object pickle (`data.pkl`) that describes exactly the storages and tensor
// views the test puts in the index, so the loaders' pickle/index cross-check accepts it, or
// deliberately not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zckpt::testing {

struct PickledStorage {
  std::string key;
  std::string location = "cpu";
  std::string storage_class = "FloatStorage";  // torch.<class>: FloatStorage, ByteStorage, ...
  uint64_t numel = 0;                          // elements of the class's dtype
};

struct PickledTensor {
  std::string name;      // a key of the top-level dict (dots are kept as they are)
  size_t storage = 0;    // index into the storages
  int64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  bool requires_grad = false;
};

// Protocol 2: {name: torch._utils._rebuild_tensor_v2(persid(('storage', torch.<class>, key,
// location, numel)), offset, shape, stride, requires_grad, OrderedDict()), ...}, in order.
std::string TorchStateDictPickle(const std::vector<PickledStorage>& storages, const std::vector<PickledTensor>& tensors);

}  // namespace zckpt::testing
