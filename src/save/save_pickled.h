// A torch.save pickle and its storages -> container, without torch: the core of zckpt::SavePickled
// (save.cc) and of the Python module's torch-free `_core` (zckpt.save of CPU state). Storages are
// given by address; the small records torch's zip writer makes (version, byteorder,
// .data/serialization_id) are made by the caller with torch's own writer (save.cc in C++,
// torch._C.PyTorchFileWriter in Python) and handed in whole.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pickle/torch_model.h"
#include "save/device_reader.h"
#include "zckpt/error.h"
#include "zckpt/save_options.h"

namespace zckpt::save {

// Where one storage's bytes are: host memory (device -1) or CUDA device `device`'s memory.
struct StorageBytes {
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
  int device = -1;
};

struct PickledBytes {
  std::string pickle;                           // data.pkl, storages as persistent ids
  std::map<std::string, StorageBytes> storages;  // every storage the pickle names, by key
  // The archive's records that are not storages, as torch's zip writer orders them: data.pkl and
  // the leading records (records_before), the storages ("data/<key>" in the pickle's order), then
  // the writer's end records (records_after); record_bytes holds every one of them.
  std::vector<std::string> records_before;
  std::vector<std::string> records_after;
  std::map<std::string, std::string> record_bytes;
  std::string prefix;                           // empty: ArchivePrefix(path)
  std::map<std::string, std::string> metadata;  // extra container metadata (not "zckpt.*")
  // Globals ("module.name") the pickle may name besides zckpt's allowlist: the caller trusts
  // them, as a load's allow_globals does; a save refuses any other, since the load would.
  std::vector<std::string> allow_globals;
};

// Makes the reader of device storages, called once at the first one; empty: a device storage is
// Error(kUnsupported) naming it.
using DeviceReaderFactory = std::function<std::unique_ptr<DeviceReader>()>;

// Writes `checkpoint` atomically at `path` (include/zckpt/save.h: the container `zckpt convert`
// makes of the equivalent .pt). Errors name `path`: kInvalidArgument when the pickle names a
// storage not supplied, one is supplied it does not name, or a size disagrees with the pickle.
SaveStats SavePickledBytes(const std::string& path, const PickledBytes& checkpoint, const SaveOptions& options,
                           const DeviceReaderFactory& make_device_reader = {});

// The pickle read as the converter reads a .pt's data.pkl: its storages and tensors, with
// Error(kUnsafe) naming a global that is neither on the allowlist nor in `allow_globals`. The check
// SavePickledBytes makes before it writes anything, for a caller that must refuse an object
// before it copies its storages (zckpt.AsyncSaver's snapshot).
pickle::TorchPickle ReadPickle(const std::string& pickle, const std::vector<std::string>& allow_globals);

// The record prefix torch.save(obj, path) writes: the file's base name without its last
// extension (c10's basename), "archive" where torch writes through a stream (a path that is not
// ASCII) or the stem is empty.
std::string ArchivePrefix(const std::string& path);

// Runs f, every zckpt::Error it throws renamed after `path` unless it names it already.
template <typename F>
auto NamingPath(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.find(path) == std::string::npos) what = path + ": " + what;
    throw Error(e.kind(), what);
  }
}

}  // namespace zckpt::save
