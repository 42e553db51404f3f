// Writing a container straight from training (libzckpt_save, LibTorch): no `.pt` on the way.
//
// The container is the one `zckpt convert` makes of the equivalent torch.save file: the object
// pickle kept as the blob data.pkl, one storage per persistent id, tensor records derived from
// that pickle by zckpt's own interpreter (the converter's code, not a second derivation), the
// archive's other records (version, byteorder, ...) as blobs, and the zckpt.source.* metadata
// `zckpt export` needs to give back a `.pt` torch.load reads.
//
// Storage bytes are never copied whole: CPU storages of 1 MiB or more are hashed and written
// from their own memory (ContainerWriter::AddStorage, no copy; smaller ones are copied into a
// chunk buffer); CUDA storages go device -> a small pinned ring (SaveOptions::cuda_slots x
// cuda_slot_bytes) -> chunk buffers -> file, on a stream of ours that first waits for torch's
// current stream.
// Atomic as every zckpt write: the file appears at `path` only after fsync + rename; any error
// leaves nothing there (and the previous file, if any, untouched).
//
// Errors (zckpt::Error): kInvalidArgument (bad options, duplicate names, a tensor zckpt cannot
// save, a pickle whose storages were not supplied or disagree with it), kUnsupported (a storage
// on a device other than cpu/cuda, CUDA in a build without it), kIo (write, fsync, rename,
// CUDA), kCorrupt (the pickle is malformed).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "zckpt/save_options.h"

namespace zckpt {

// For C++ trainers: `tensors` saved as the dict {name: tensor} torch.save would write (pickled
// by LibTorch's own torch::jit::Pickler: torch._utils._rebuild_tensor_v2 and storage persistent
// ids), so zckpt.load / zckpt::Load / `zckpt export` + torch.load give back a dict of these
// names in this order. Tensors sharing a storage (views, tied weights: the same tensor under
// two names) keep sharing it. Dense strided tensors on cpu or cuda only; names unique; two
// tensors viewing one storage must have one dtype (torch.save's own rule). `metadata` goes to
// the container's metadata table (keys starting with "zckpt." are reserved: refused).
SaveStats Save(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
               const std::map<std::string, std::string>& metadata = {}, const SaveOptions& options = {});

// What torch.save would write, in parts: the general form behind Save and Python's zckpt.save.
struct PickledCheckpoint {
  // The object pickle (data.pkl): storages as persistent ids ('storage', storage_type, key,
  // location, numel), as torch.serialization._save's persistent_id writes them.
  std::string pickle;
  // Every storage the pickle names: key -> 1-D uint8 tensor over the whole storage (cpu or
  // cuda). The location written is the pickle's; the tensor only says where the bytes are.
  std::map<std::string, at::Tensor> storages;
  // The records torch.save writes between data.pkl and the storages, in order:
  // (".format_version", "1"), (".storage_alignment", "64"), ("byteorder", "little").
  // The records torch's zip writer adds at the end (version, .data/serialization_id) are made
  // by that writer (caffe2::serialize::PyTorchStreamWriter), not by zckpt.
  std::vector<std::pair<std::string, std::string>> records;
  // The zip archive's record prefix; empty: what torch.save(obj, path) would write (the file's
  // stem, "archive" for a non-ASCII path).
  std::string prefix;
  std::map<std::string, std::string> metadata;  // extra container metadata (not "zckpt.*")
};

SaveStats SavePickled(const std::string& path, const PickledCheckpoint& checkpoint, const SaveOptions& options = {});

}  // namespace zckpt
