// The checkpoint's object tree as a c10::IValue: the kept object pickle (blob `data.pkl`)
// walked by the restricted interpreter (src/pickle, nothing executed), with each tensor node
// replaced by the loaded tensor of the same name. The mapping is documented at
// TensorSet::tree (include/zckpt/loader.h).
#pragma once

#include <ATen/core/ivalue.h>

#include "zckpt/container.h"
#include "zckpt/loader.h"

namespace zckpt::loader {

// `set` holds the container's tensors (views) and storages. Throws Error: kCorrupt (the blob
// fails its checksum, a malformed pickle, a tensor the pickle names that the container lacks),
// kUnsafe (the pickle names a code-running global). A container without an object pickle gives
// a dict of every tensor by name, in table order.
c10::IValue BuildObjectTree(const Container& c, const TensorSet& set);

}  // namespace zckpt::loader
