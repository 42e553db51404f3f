// The storages a torch pickle names through persistent ids:
//   ('storage', storage_type, key, location, numel)               zip format
//   ('storage', storage_type, root_key, location, root_numel, view) legacy format, where view is
//   None or (view_key, offset, view_numel) in elements of storage_type
// One table entry per key (a key seen twice must make the same claims); a legacy view resolves
// to its root storage plus a byte offset.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "pickle/torch_model.h"
#include "pickle/value.h"

namespace zckpt::pickle {

struct StorageRef {
  size_t index = 0;               // into StorageTable::storages()
  uint64_t view_offset_bytes = 0;  // where a legacy storage view starts in its root
  uint64_t view_nbytes = 0;        // bytes the reference may use from there
};

class StorageTable {
 public:
  // Reads every persistent id in the arena, in the order the pickle built them.
  explicit StorageTable(const ValueArena& arena);

  // What a kPersistentId node refers to; kCorrupt when `pid` is not one of the arena's.
  const StorageRef& Resolve(const Value* pid) const;
  const std::vector<TorchStorage>& storages() const { return storages_; }
  std::vector<TorchStorage> TakeStorages() { return std::move(storages_); }

 private:
  StorageRef Add(const Value* pid);
  size_t AddRoot(TorchStorage storage, uint64_t offset);

  std::vector<TorchStorage> storages_;
  std::unordered_map<std::string, size_t> by_key_;
  std::unordered_map<const Value*, StorageRef> refs_;
  std::unordered_map<std::string, StorageRef> views_;
};

}  // namespace zckpt::pickle
