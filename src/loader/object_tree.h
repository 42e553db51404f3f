// The checkpoint's object tree as a c10::IValue: the kept object pickle (blob `data.pkl`)
// walked by the restricted interpreter (src/pickle, nothing executed), with each tensor node
// replaced by the loaded tensor of the same name. The mapping is documented at
// TensorSet::tree (include/zckpt/loader.h).
#pragma once

#include <ATen/core/ivalue.h>

#include <optional>

#include "checkpoint/object_pickle.h"
#include "zckpt/container.h"
#include "zckpt/loader.h"

namespace zckpt::loader {

// `set` holds the container's tensors (views) and storages; `pickle` is the container's object
// pickle as checkpoint::ReadObjectPickle read it (vetted, and agreeing with the index), nullopt when
// it keeps none: then the tree is a dict of every tensor by name, in table order. Throws
// Error(kCorrupt) naming the file for a tree deeper than the pickle was read under (a back edge
// of a cycle becomes None).
c10::IValue BuildObjectTree(const Container& c, const TensorSet& set, const std::optional<checkpoint::ObjectPickle>& pickle);

}  // namespace zckpt::loader
