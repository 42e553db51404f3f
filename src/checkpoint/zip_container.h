// The container `zckpt convert` makes of a torch zip archive, written from the archive's parts
// by whoever holds them: the converter reads them from a `.pt` file, zckpt::Save has them from
// the objects torch.save would have written. One piece of code, so a saved container is the one
// converting the equivalent torch.save file gives (same storages, tensor records, blobs and
// zckpt.source.* metadata; format-spec/source-metadata.md).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pickle/torch_model.h"
#include "zckpt/error.h"
#include "zckpt/container_writer.h"

namespace zckpt::checkpoint {

// Where the bytes come from.
class ZipParts {
 public:
  virtual ~ZipParts() = default;
  // The bytes of record `name` (prefix excluded) that is not one of the pickle's storages:
  // data.pkl, version, byteorder, ... and `data/<key>` records no persistent id names. Valid
  // until the next call.
  virtual std::span<const uint8_t> Record(const std::string& name) = 0;
  // Writes storage `s` into `writer` as StorageRecordOf(s) (AddStorage, or BeginStorage /
  // AppendStorage / EndStorage), exactly s.nbytes bytes.
  virtual void WriteStorage(const pickle::TorchStorage& s, ContainerWriter& writer) = 0;
};

struct ZipCounts {
  uint64_t storages = 0;
  uint64_t tensors = 0;
};

// Writes, in this order: every storage of `model` (pickle order), the tensor records of
// `model`, every other record of `records` (archive order, data.pkl included) as a blob named
// like the record, and the metadata export needs (zckpt.source.format = zip, .prefix,
// .records). Does not commit. Error(`missing`) when `records` does not list a storage of the
// pickle (`data/<key>`) or data.pkl: export could not give it back. Whose fault that is depends
// on where `records` came from: a .pt file's archive (kCorrupt: the file is damaged or forged)
// or a caller's list (kInvalidArgument).
ZipCounts WriteZipContainer(ContainerWriter& writer, const pickle::TorchPickle& model,
                            const std::vector<std::string>& records, const std::string& prefix, ZipParts& parts,
                            ErrorKind missing);

// The storage record of a pickle's storage (key, location, dtype, untyped as the pickle says).
NewStorage StorageRecordOf(const pickle::TorchStorage& s);

// Adds the tensor records of `model` (names, views, flags, extra as the interpreter derived
// them); returns how many. kCorrupt for a negative storage offset.
uint64_t AddTensorRecords(ContainerWriter& writer, const pickle::TorchPickle& model);

}  // namespace zckpt::checkpoint
