// What `zckpt merge` assembles: each full tensor of a sharded checkpoint with the saved pieces
// that tile it, found from the shards' placement metadata (layouts.cc) and then read into one
// host buffer (assemble.cc). Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "zckpt/container.h"
#include "zckpt/dtype.h"

namespace zckpt::merge {

// A tensor as saved in one file: a view (dtype, shape, stride, element offset) of a storage that
// is either a container's (read chunk by chunk, each checked) or a byte range of a mapped
// `.pt`/`.distcp` file (its zip CRC-32 checked when recorded).
struct SavedView {
  std::string what;  // "FILE: tensor 'NAME'", for messages
  const Container* container = nullptr;
  uint32_t storage = 0;
  const MappedFile* file = nullptr;  // file storages: the file, read with pread (ReadView)
  const uint8_t* bytes = nullptr;  // file storages: where the storage lies in its mapping (null file: memory)
  uint64_t bytes_size = 0;
  uint32_t crc32 = 0;              // file storages: recorded CRC-32 (0: none)
  DType dtype = DType::kInvalid;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  uint64_t storage_offset = 0;     // elements
};

// A saved view placed in the full tensor at `offsets` (its box: offsets + view.shape).
struct Piece {
  SavedView view;
  std::vector<int64_t> offsets;
  // Other saved views of the same box (Replicate placements, a plain tensor on every rank): Tile
  // moves them here, and Assemble checks each holds the same bytes as `view` (else an error).
  std::vector<SavedView> replicas = {};
};

struct FullTensor {
  std::string name;
  DType dtype = DType::kInvalid;
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;
  // The shape the pieces tile when it is not `shape`: FSDP1's flat optimizer moments cut a
  // parameter into 1-D runs of its row-major elements, so they tile its [numel] (same bytes).
  std::vector<int64_t> tile_shape = {};
  const std::vector<int64_t>& tiled() const { return tile_shape.empty() ? shape : tile_shape; }
  uint64_t bytes() const;
};

// A sharded checkpoint opened for merging: its tensors, and the open files they point into.
struct Checkpoint {
  std::string layout;
  std::vector<FullTensor> tensors;    // in the order the checkpoint lists them
  std::string huggingface_dir;        // the checkpoint's huggingface/ folder, "" when none
  std::vector<std::unique_ptr<Container>> containers;
  std::vector<std::shared_ptr<const MappedFile>> files;
};

// "[2, 3]", for messages.
std::string Dims(const std::vector<int64_t>& v);

// `name` as the output calls it: `keys` removed from its front; false when it does not start so.
bool SelectName(const std::string& keys, std::string* name);

}  // namespace zckpt::merge
