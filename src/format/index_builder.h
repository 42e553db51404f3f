// Builds the index of spec §5 from records: header, the seven table descriptors, the tables in
// id order at 8-byte-aligned offsets, and a string pool in which each distinct string is stored
// once (storage locations and repeated names cost one copy).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zckpt/format.h"

namespace zckpt::format::internal {

class IndexBuilder {
 public:
  // The string's place in the pool, adding it on first use. Throws Error(kInvalidArgument) when
  // the pool would pass 4 GiB (StringRef offsets are u32).
  StringRef Intern(std::string_view s);

  void AddStorage(const StorageRecord& r);
  void AddChunk(const ChunkRecord& r);
  // Appends the tensor's sizes then strides to the dims table and points r.dims at them.
  void AddTensor(TensorRecord r, std::span<const int64_t> sizes, std::span<const int64_t> strides);
  void AddBlob(const BlobRecord& r);
  void AddMetadata(const MetadataRecord& r);

  // The index bytes.
  std::vector<uint8_t> Finish() const;

 private:
  uint8_t* Append(TableId table);
  std::vector<uint8_t> tables_[kTableCount];  // encoded records of tables 1..6 (7 is pool_)
  std::string pool_;
  std::unordered_map<std::string, StringRef> interned_;
};

}  // namespace zckpt::format::internal
