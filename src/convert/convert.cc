// zckpt convert: `.pt` -> container. Reads the source through a mapping (never whole into
// memory), interprets its pickle without running anything, and streams every storage into a
// ContainerWriter in bounded pieces, dropping source pages behind it.
#include <algorithm>
#include <cctype>
#include <string>
#include <unordered_set>

#include "common/mapped_file.h"
#include "convert/source_records.h"
#include "pickle/legacy.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "pt/pt_archive.h"
#include "pt/pt_format.h"
#include "zckpt/container_writer.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

// Storage bytes are handed to the writer in pieces of this size, so progress and cancellation
// are responsive on a multi-GiB tensor and source pages can be released behind the stream.
constexpr uint64_t kPieceBytes = 64ull << 20;

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

class Converter {
 public:
  Converter(const std::string& source, const std::string& destination, const ConvertOptions& options)
      : source_(source), options_(options), writer_(destination, options.writer) {}

  ConvertStats Run(const std::shared_ptr<const MappedFile>& file) {
    stats_.source_bytes = file->size();
    pt::PtFormat format = pt::DetectPtFormat(std::span<const uint8_t>(
        file->data(), std::min<size_t>(file->size(), pt::kPtFormatProbeBytes)));
    switch (format) {
      case pt::PtFormat::kZip: ConvertZip(file); break;
      case pt::PtFormat::kLegacy: ConvertLegacy(*file); break;
      case pt::PtFormat::kLegacyTar:
        throw Error(ErrorKind::kUnsupported, "the tar-based format of torch <= 0.3 is not supported");
      case pt::PtFormat::kUnknown:
        throw Error(ErrorKind::kNotContainer, "not a torch.save file (neither a zip archive nor the legacy format)");
    }
    writer_.SetMetadata(std::string(convert::kKeyName), BaseName(source_));
    writer_.SetMetadata(std::string(convert::kKeyBytes), std::to_string(file->size()));
    stats_.written = writer_.Commit();
    return stats_;
  }

 private:
  void ConvertZip(const std::shared_ptr<const MappedFile>& file) {
    stats_.source_format = "zip";
    pt::TorchArchive archive(file);
    pickle::UnpickleResult tree = pickle::Unpickle(archive.Record(convert::kObjectPickleBlob));
    pickle::TorchPickle model = pickle::InterpretTorchPickle(tree);
    BeginProgress(model.storages);

    std::unordered_set<std::string> storage_records;
    for (const pickle::TorchStorage& s : model.storages) {
      std::span<const uint8_t> bytes = archive.StorageRecord(s.key);
      if (bytes.size() != s.nbytes) {
        throw Error(ErrorKind::kCorrupt, "record data/" + s.key + " holds " + std::to_string(bytes.size()) +
                                             " bytes but the pickle claims " + std::to_string(s.nbytes) + " (" +
                                             std::to_string(s.numel) + " x " + std::string(DTypeName(s.dtype)) + ")");
      }
      AddStorage(s.key, s.location, s.dtype, s.untyped, bytes, *file);
      storage_records.insert(std::string(convert::kStorageRecordPrefix) + s.key);
    }
    AddTensors(model);
    // Every other record (data.pkl, byteorder, version, ..., and storage records no tensor
    // references) is kept verbatim, and the archive order with it, so export gives it back.
    for (const pt::TorchRecord& r : archive.records()) {
      if (storage_records.count(r.name)) continue;
      writer_.AddBlob(r.name, archive.Record(r.name));
    }
    writer_.SetMetadata(std::string(convert::kKeyFormat), "zip");
    writer_.SetMetadata(std::string(convert::kKeyPrefix), archive.prefix());
    writer_.SetMetadata(std::string(convert::kKeyRecords), convert::JoinRecords(archive.RecordNames()));
  }

  void ConvertLegacy(const MappedFile& file) {
    stats_.source_format = "legacy";
    std::span<const uint8_t> bytes(file.data(), file.size());
    pickle::LegacyLayout layout = pickle::ParseLegacy(bytes);
    BeginProgress(layout.model.storages);
    // Data-section order, so export rebuilds the file byte for byte.
    for (const pickle::LegacyStorage& s : layout.storages) {
      AddStorage(s.key, s.location, s.dtype, /*untyped=*/false, bytes.subspan(s.data_offset, s.nbytes), file);
    }
    AddTensors(layout.model);
    writer_.AddBlob(std::string(convert::kLegacyHeaderBlob), bytes.subspan(0, layout.header_end));
    writer_.AddBlob(std::string(convert::kObjectPickleBlob),
                    bytes.subspan(layout.object_pickle_offset, layout.object_pickle_size));
    if (layout.data_end < bytes.size())
      writer_.AddBlob(std::string(convert::kLegacyTrailerBlob), bytes.subspan(layout.data_end));
    writer_.SetMetadata(std::string(convert::kKeyFormat), "legacy");
  }

  void BeginProgress(const std::vector<pickle::TorchStorage>& storages) {
    for (const auto& s : storages) total_ += s.nbytes;
    Report();
  }

  void Report() {
    if (options_.progress) options_.progress(done_, total_);
  }

  void AddStorage(const std::string& key, const std::string& location, DType dtype, bool untyped,
                  std::span<const uint8_t> bytes, const MappedFile& file) {
    NewStorage ns{key, location, dtype, untyped};
    writer_.BeginStorage(ns, bytes.size());
    for (uint64_t off = 0; off < bytes.size(); off += kPieceBytes) {
      if (options_.cancel && options_.cancel->load()) throw Error(ErrorKind::kCancelled, "conversion cancelled");
      uint64_t n = std::min<uint64_t>(kPieceBytes, bytes.size() - off);
      writer_.AppendStorage(bytes.subspan(off, n));
      file.Release(static_cast<uint64_t>(bytes.data() + off - file.data()), n);
      done_ += n;
      Report();
    }
    writer_.EndStorage();
    stats_.storages++;
  }

  void AddTensors(const pickle::TorchPickle& model) {
    for (const pickle::TorchTensor& t : model.tensors) {
      if (t.storage_offset < 0)
        throw Error(ErrorKind::kCorrupt, "tensor '" + t.name + "' has a negative storage offset");
      NewTensor nt;
      nt.name = t.name;
      nt.storage = static_cast<uint32_t>(t.storage);
      nt.dtype = t.dtype;
      nt.shape = t.shape;
      nt.stride = t.stride;
      nt.storage_offset = static_cast<uint64_t>(t.storage_offset);
      nt.flags = (t.requires_grad ? format::kTensorRequiresGrad : 0) | (t.is_parameter ? format::kTensorParameter : 0) |
                 (t.conj ? format::kTensorConj : 0) | (t.neg ? format::kTensorNeg : 0) |
                 (t.dtensor_local ? format::kTensorDTensorLocal : 0) |
                 (t.sharded_local ? format::kTensorShardedLocal : 0) | (t.quantized ? format::kTensorQuantized : 0) |
                 (t.internal ? format::kTensorInternal : 0);
      nt.extra = t.extra;
      writer_.AddTensor(nt);
      stats_.tensors++;
    }
  }

  std::string source_;
  const ConvertOptions& options_;
  ContainerWriter writer_;
  ConvertStats stats_;
  uint64_t done_ = 0, total_ = 0;
};

}  // namespace

ConvertStats ConvertFile(const std::string& source, const std::string& destination, const ConvertOptions& options) {
  try {
    auto file = std::make_shared<const MappedFile>(source);
    file->AdviseSequential(0, file->size());
    Converter converter(source, destination, options);
    return converter.Run(file);
  } catch (const Error& e) {
    // Every message names the source; the writer's destructor has removed its temporary file.
    std::string what = e.what();
    if (what.find(source) == std::string::npos) what = source + ": " + what;
    throw Error(e.kind(), what);
  }
}

bool IsTorchCheckpointName(const std::string& name) {
  std::string lower = Lower(name);
  for (const char* ext : {".pt", ".pth", ".bin"}) {
    std::string e(ext);
    if (lower.size() > e.size() && lower.compare(lower.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

std::string DefaultDestination(const std::string& source) {
  std::string base = BaseName(source);
  size_t dot = base.rfind('.');
  if (dot != std::string::npos && dot > 0 && IsTorchCheckpointName(base))
    return source.substr(0, source.size() - (base.size() - dot)) + ".zckpt";
  return source + ".zckpt";
}

}  // namespace zckpt
