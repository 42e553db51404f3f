// Tensor rebuild calls (torch/_utils.py, torch/_tensor.py) read as tensor descriptions:
//   _rebuild_tensor(storage, offset, size, stride)
//   _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
//   _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
//   _rebuild_qtensor(storage, offset, size, stride, quantizer_params, requires_grad, hooks)
//   _rebuild_parameter(data, requires_grad, hooks), _rebuild_parameter_with_state(..., state),
//   torch.nn.parameter.Parameter(data[, requires_grad])
//   _rebuild_from_type_v2(func, new_type, args, state), _rebuild_from_type(func, type, args, dict)
//     with func = _rebuild_wrapper_subclass for DTensor / ShardedTensor (torch_distributed.h).
// Shapes, strides and offsets are checked against the storage the tensor names.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pickle/torch_model.h"
#include "pickle/torch_storages.h"
#include "pickle/value.h"

namespace zckpt::pickle {

// What one rebuild call describes, before the walker names it.
struct TensorFinding {
  struct Named {
    std::string suffix;  // appended to the call's path with '.'; "" is the call's own path
    TorchTensor tensor;
  };
  struct More {
    const Value* node;   // more of the tree that may hold tensors (Python state, the mesh)
    std::string suffix;
    bool is_state;       // an object state: its attributes sit directly under the path
    bool internal = false;  // metadata of the tensor (a DTensor's spec): tensors found there are internal
  };
  std::vector<Named> tensors;
  std::vector<More> walk;
  std::vector<const Value*> consumed;  // inner nodes the records stand for (never named again)
};

class TensorInterpreter {
 public:
  explicit TensorInterpreter(const StorageTable& storages) : storages_(storages) {}

  // True when `obj` calls a rebuild function above (cheap: checks the callable only).
  static bool IsRebuildCall(const Value* obj);
  // nullopt when `obj` is not a tensor rebuild call. Errors (kCorrupt/kUnsupported) name `path`.
  std::optional<TensorFinding> Interpret(const Value* obj, const std::string& path) const;

 private:
  std::optional<TensorFinding> Call(const Value* fn, const Value* args, const std::string& path, int depth) const;
  TensorFinding Plain(std::string_view fn, const std::vector<Value*>& a, const std::string& path) const;
  TensorFinding Parameter(std::string_view fn, const std::vector<Value*>& a, const std::string& path, int depth) const;
  TensorFinding FromType(const std::vector<Value*>& a, const std::string& path, int depth) const;
  std::optional<TensorFinding> Wrapper(const Value* wrapper_args, const Value* state, const std::string& path,
                                       int depth) const;
  // The one tensor an inner rebuild call (a parameter's data, a local shard) describes.
  TensorFinding Inner(const Value* obj, const std::string& path, int depth) const;

  const StorageTable& storages_;
};

}  // namespace zckpt::pickle
