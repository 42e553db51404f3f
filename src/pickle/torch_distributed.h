// Tensor subclasses of distributed training, pickled as
//   torch._tensor._rebuild_from_type_v2(_rebuild_wrapper_subclass, cls,
//       (cls, dtype, global_size, global_stride, offset, layout, device, requires_grad), state)
// DTensor: state holds `_local_tensor` and `_spec` (DTensorSpec: mesh, placements, tensor_meta).
// ShardedTensor: state is (local_shards, ShardedTensorMetadata, pg_state, spec, init_rrefs).
// Classes are matched by name: their modules moved between torch releases.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pickle/value.h"

namespace zckpt::pickle {

struct DTensorParts {
  const Value* local_tensor = nullptr;  // an ordinary tensor rebuild
  const Value* spec = nullptr;          // DTensorSpec (walked for the mesh tensor)
  bool requires_grad = false;
  bool is_param = false;                // saved as nn.Parameter (`_is_param` in the state)
  std::string extra;                    // JSON: global shape/stride, placements, mesh
};

struct ShardParts {
  const Value* tensor = nullptr;  // an ordinary tensor rebuild
  std::string extra;              // JSON: global shape, offsets, sizes, placement
};

struct ShardedTensorParts {
  std::vector<ShardParts> shards;
  bool requires_grad = false;
};

bool IsDTensorClass(const Value* cls);
bool IsShardedTensorClass(const Value* cls);

// nullopt when the state does not have the layout above.
std::optional<DTensorParts> ReadDTensor(const Value* cls, const Value* wrapper_args, const Value* state);
std::optional<ShardedTensorParts> ReadShardedTensor(const Value* cls, const Value* wrapper_args, const Value* state);

}  // namespace zckpt::pickle
