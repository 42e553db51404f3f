// SavePickledBytes: a torch.save pickle and its storages -> container, through the converter's own
// code (checkpoint::WriteZipContainer) with the storages read from memory instead of from a `.pt`.
#include "save/save_pickled.h"

#include <chrono>
#include <set>
#include <span>

#include "checkpoint/zip_container.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "zckpt/dtype.h"

namespace zckpt::save {

namespace {

[[noreturn]] void Invalid(const std::string& what) { throw Error(ErrorKind::kInvalidArgument, what); }

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// The checkpoint's side of checkpoint::ZipParts: records from memory, storages from their
// addresses. Host storages are handed to the writer from their own memory (it copies chunk by
// chunk into its hashing pipeline, never the whole storage); device storages go through the
// device reader's pinned ring.
class BytesParts final : public checkpoint::ZipParts {
 public:
  BytesParts(const PickledBytes& checkpoint, const DeviceReaderFactory& make_device_reader, const std::string& path,
             SaveStats& stats)
      : checkpoint_(checkpoint), make_device_reader_(make_device_reader), path_(path), stats_(stats) {}

  std::span<const uint8_t> Record(const std::string& name) override {
    auto it = checkpoint_.record_bytes.find(name);
    if (it == checkpoint_.record_bytes.end()) Invalid(path_ + ": no bytes for record '" + name + "'");
    return AsBytes(it->second);
  }

  void WriteStorage(const pickle::TorchStorage& s, ContainerWriter& writer) override {
    const StorageBytes& b = checkpoint_.storages.at(s.key);  // checked by CheckStorages
    NewStorage ns = checkpoint::StorageRecordOf(s);
    if (b.device < 0) {
      writer.AddStorage(ns, std::span<const uint8_t>(b.data, s.nbytes));
      return;
    }
    if (!reader_) {
      if (!make_device_reader_)
        throw Error(ErrorKind::kUnsupported, path_ + ": storage '" + s.key + "' is in device memory, which this "
                                                     "writer cannot read");
      reader_ = make_device_reader_();
    }
    writer.BeginStorage(ns, s.nbytes);
    reader_->Read(b.data, s.nbytes, b.device, [&](std::span<const uint8_t> piece) { writer.AppendStorage(piece); });
    writer.EndStorage();
    stats_.cuda_bytes += s.nbytes;
    stats_.cuda_ring_bytes = reader_->ring_bytes();
  }

 private:
  const PickledBytes& checkpoint_;
  const DeviceReaderFactory& make_device_reader_;
  const std::string& path_;
  SaveStats& stats_;
  std::unique_ptr<DeviceReader> reader_;
};

// Every storage the pickle names is supplied, of the size the pickle claims; nothing else is.
void CheckStorages(const std::string& path, const pickle::TorchPickle& model, const PickledBytes& checkpoint) {
  std::set<std::string> named;
  for (const pickle::TorchStorage& s : model.storages) {
    named.insert(s.key);
    auto it = checkpoint.storages.find(s.key);
    if (it == checkpoint.storages.end()) Invalid(path + ": the pickle names storage '" + s.key + "', which was not supplied");
    if (it->second.bytes != s.nbytes)
      Invalid(path + ": storage '" + s.key + "' holds " + std::to_string(it->second.bytes) + " bytes but the pickle claims " +
              std::to_string(s.nbytes) + " (" + std::to_string(s.numel) + " x " + std::string(DTypeName(s.dtype)) + ")");
  }
  for (const auto& [key, b] : checkpoint.storages)
    if (!named.count(key)) Invalid(path + ": storage '" + key + "' was supplied but the pickle does not name it");
}

void CheckMetadata(const std::string& path, const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata)
    if (key.rfind("zckpt.", 0) == 0) Invalid(path + ": metadata key '" + key + "' is reserved (zckpt.*)");
}

}  // namespace

pickle::TorchPickle ReadPickle(const std::string& pickle, const std::vector<std::string>& allow_globals) {
  pickle::UnpickleOptions read;
  read.allow_globals = allow_globals;
  return pickle::InterpretTorchPickle(pickle::Unpickle(AsBytes(pickle), read));
}

std::string ArchivePrefix(const std::string& path) {
  for (unsigned char c : path)
    if (c >= 0x80) return "archive";
  size_t slash = path.find_last_of("/\\");  // torch's basename splits at both
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  size_t dot = base.rfind('.');
  std::string stem = dot == std::string::npos ? base : base.substr(0, dot);
  return stem.empty() ? "archive" : stem;
}

SaveStats SavePickledBytes(const std::string& path, const PickledBytes& checkpoint, const SaveOptions& options,
                           const DeviceReaderFactory& make_device_reader) {
  return NamingPath(path, [&] {
    auto t0 = std::chrono::steady_clock::now();
    CheckMetadata(path, checkpoint.metadata);
    // Storages and tensor records exactly as `zckpt convert` derives them from the equivalent .pt.
    pickle::TorchPickle model = ReadPickle(checkpoint.pickle, checkpoint.allow_globals);
    CheckStorages(path, model, checkpoint);

    std::vector<std::string> records = checkpoint.records_before;
    for (const pickle::TorchStorage& s : model.storages) records.push_back("data/" + s.key);
    records.insert(records.end(), checkpoint.records_after.begin(), checkpoint.records_after.end());

    SaveStats stats;
    ContainerWriter writer(path, options.writer);
    BytesParts parts(checkpoint, make_device_reader, path, stats);
    checkpoint::ZipCounts counts = checkpoint::WriteZipContainer(
        writer, model, records, checkpoint.prefix.empty() ? ArchivePrefix(path) : checkpoint.prefix,
        parts, ErrorKind::kInvalidArgument);
    for (const auto& [key, value] : checkpoint.metadata) writer.SetMetadata(key, value);
    stats.written = writer.Commit();
    stats.storages = counts.storages;
    stats.tensors = counts.tensors;
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return stats;
  });
}

}  // namespace zckpt::save
