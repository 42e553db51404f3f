// torch.distributed.checkpoint's `.metadata`, read by zckpt's restricted interpreter.
//
// DCP writes the checkpoint's layout as a pickle of its own dataclasses (Metadata,
// TensorStorageMetadata, ChunkStorageMetadata, MetadataIndex, ...). Read here without running
// anything, and accepted only when every global it names is one of those classes (or torch.Size,
// a torch dtype, a layout, pathlib paths, OrderedDict): metadata is plain data, so an allowlist
// this narrow refuses nothing DCP writes and everything else (Error kUnsafe naming the global).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zckpt/dtype.h"

namespace zckpt::pickle {

// One piece of a tensor as saved by one rank: the box [offsets, offsets + sizes).
struct DcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

// One entry of Metadata.state_dict_metadata: a tensor (global size, dtype, its saved pieces)
// or a BytesIO item (anything else DCP saved with torch.save).
struct DcpItem {
  std::string fqn;
  bool is_tensor = false;
  DType dtype = DType::kInvalid;
  std::vector<int64_t> size;
  std::vector<DcpChunk> chunks;
};

// One entry of Metadata.storage_data: where the piece (fqn, offset) lies.
struct DcpStorage {
  std::string fqn;
  std::vector<int64_t> offset;  // MetadataIndex.offset; empty for BytesIO items and 0-dim tensors
  std::string relative_path;    // the file, relative to the checkpoint folder
  // FileSystemWriter's _StorageInfo: the byte range of the item in `relative_path` (a torch.save
  // archive for a tensor, the raw bytes for a BytesIO item).
  bool file_slice = false;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  bool transformed = false;  // written through stream transforms (DCP extensions): not readable here
  // ZckptStorageWriter's (relative_path, name): the tensor record or blob of that name.
  std::string name;
};

struct DcpMetadata {
  std::vector<DcpItem> items;      // in state_dict_metadata order
  std::vector<DcpStorage> storage; // in storage_data order
  std::string version;             // Metadata.version ("" when absent)

  const DcpItem* FindItem(const std::string& fqn) const;
  // The storage entry of piece (fqn, offsets), nullptr when none.
  const DcpStorage* FindStorage(const std::string& fqn, const std::vector<int64_t>& offsets) const;

  // Filled by ReadDcpMetadata, which refuses a repeated key.
  std::map<std::string, size_t> item_index;
  std::map<std::pair<std::string, std::vector<int64_t>>, size_t> storage_index;
};

// Reads a `.metadata` pickle. Throws Error: kUnsafe (a global outside the allowlist, named with
// its pickle offset), kCorrupt (not DCP metadata: what is wrong and where), or the interpreter's
// own errors. `what` (the file name) starts every message.
DcpMetadata ReadDcpMetadata(std::span<const uint8_t> pickle, const std::string& what);

// True when (module, name) is a global DCP metadata may name.
bool IsDcpMetadataGlobal(std::string_view module, std::string_view name);

}  // namespace zckpt::pickle
