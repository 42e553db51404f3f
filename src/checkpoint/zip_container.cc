#include "checkpoint/zip_container.h"

#include <unordered_set>

#include "checkpoint/object_pickle.h"
#include "checkpoint/source_records.h"
#include "format/layout.h"
#include "zckpt/error.h"

namespace zckpt::checkpoint {

NewStorage StorageRecordOf(const pickle::TorchStorage& s) { return NewStorage{s.key, s.location, s.dtype, s.untyped}; }

uint64_t AddTensorRecords(ContainerWriter& writer, const pickle::TorchPickle& model) {
  for (const pickle::TorchTensor& t : model.tensors) {
    if (t.storage_offset < 0) throw Error(ErrorKind::kCorrupt, "tensor '" + t.name + "' has a negative storage offset");
    // The int64 bounds of spec §5.3 (also for tensors without elements), which the writer would
    // otherwise refuse as the caller's mistake: here they are the source's.
    format::internal::TensorExtent e =
        format::internal::ComputeTensorExtent(static_cast<uint64_t>(t.storage_offset), t.shape.data(), t.stride.data(),
                                              static_cast<uint32_t>(t.shape.size()), DTypeSize(t.dtype));
    if (e.error) throw Error(ErrorKind::kCorrupt, "tensor '" + t.name + "': " + e.error);
    NewTensor nt;
    nt.name = t.name;
    nt.storage = static_cast<uint32_t>(t.storage);
    nt.dtype = t.dtype;
    nt.shape = t.shape;
    nt.stride = t.stride;
    nt.storage_offset = static_cast<uint64_t>(t.storage_offset);
    nt.flags = IndexFlags(t);
    nt.extra = t.extra;
    writer.AddTensor(nt);
  }
  return model.tensors.size();
}

ZipCounts WriteZipContainer(ContainerWriter& writer, const pickle::TorchPickle& model,
                            const std::vector<std::string>& records, const std::string& prefix, ZipParts& parts,
                            ErrorKind missing) {
  std::unordered_set<std::string> listed(records.begin(), records.end());
  if (!listed.count(std::string(kObjectPickleBlob)))
    throw Error(missing, "the record list does not name " + std::string(kObjectPickleBlob));
  std::unordered_set<std::string> storage_records;
  for (const pickle::TorchStorage& s : model.storages) {
    std::string name = std::string(kStorageRecordPrefix) + s.key;
    if (!listed.count(name))
      throw Error(missing, "the record list does not name " + name + ", a storage of the pickle");
    storage_records.insert(std::move(name));
  }
  ZipCounts counts;
  for (const pickle::TorchStorage& s : model.storages) {
    parts.WriteStorage(s, writer);
    counts.storages++;
  }
  counts.tensors = AddTensorRecords(writer, model);
  // Every other record (data.pkl, byteorder, version, ..., and storage records no tensor
  // references) is kept verbatim, and the archive order with it, so export gives it back.
  for (const std::string& name : records) {
    if (storage_records.count(name)) continue;
    writer.AddBlob(name, parts.Record(name));
  }
  writer.SetMetadata(std::string(kKeyFormat), "zip");
  writer.SetMetadata(std::string(kKeyPrefix), prefix);
  writer.SetMetadata(std::string(kKeyRecords), JoinRecords(records));
  return counts;
}

}  // namespace zckpt::checkpoint
