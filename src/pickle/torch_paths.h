// Tensor names as paths through the object tree, built lazily.
//
// Every child the walk pushes records its parent path and its own segment (a dict key node, an
// index, or a literal such as "_spec"); a string is made only when a tensor is named or an
// error is reported. A small pickle can share one huge key among many entries, so building
// every path eagerly could take memory far beyond the pickle's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pickle/value.h"

namespace zckpt::pickle {

class PathTable {
 public:
  using Id = uint32_t;
  static constexpr Id kRoot = 0;  // the empty path

  PathTable();

  Id Key(Id parent, const Value* key);  // a dict key: strings and ints as they read
  Id Index(Id parent, size_t index);
  // A literal segment (may hold dots: "local_shards.0"); "" is `parent` itself.
  Id Literal(Id parent, std::string segment);

  // The path joined with '.'; nullopt when it would be longer than `max_bytes`.
  std::optional<std::string> Text(Id id, size_t max_bytes) const;
  // For messages: the whole path, or "..." and its last 200 or so bytes.
  std::string Display(Id id) const;

 private:
  struct Node {
    Id parent;
    const Value* key;    // a dict key, or
    int64_t index;       // a sequence index (>= 0), or
    std::string literal; // a literal segment
  };
  size_t SegmentLength(const Node& n) const;
  std::string Segment(const Node& n) const;

  std::vector<Node> nodes_;
  // Rendered text of keys that are neither str nor int (tuples, big ints, bytes), once per key
  // node: one shared key may sit on the path of many tensors.
  mutable std::unordered_map<const Value*, std::string> rendered_keys_;
};

}  // namespace zckpt::pickle
