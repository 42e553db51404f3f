// Calls to pure data constructors that the tree holds as plain values instead of Objects:
// torch's `_codecs.encode(text, 'latin1')` bytes idiom (how protocol 2 pickles `bytes`),
// `builtins.bytes`/`bytearray(...)` and `builtins.set`/`frozenset(...)` (how protocols 0-3
// pickle sets). Anything with odd arguments stays an Object.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pickle/value.h"

namespace zckpt::pickle {

struct FoldedValue {
  Kind kind = Kind::kBytes;   // kBytes, kSet or kFrozenSet
  bool bytearray = false;
  std::string bytes;          // kBytes
  std::vector<Value*> items;  // kSet / kFrozenSet members, as listed
};

// What `callable(*args)` evaluates to when it is one of the constructors above.
std::optional<FoldedValue> FoldDataConstructor(const Value* callable, const Value* args);

}  // namespace zckpt::pickle
