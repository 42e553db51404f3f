// zckpt convert: `.pt` or safetensors -> container. Finds the source's parts through a mapping
// (never whole into memory), interprets its pickle without running anything (a safetensors file
// gets the pickle torch.save would write for its tensors), and streams every storage into a
// ContainerWriter in bounded pieces read with pread (a source that shrinks is an error naming it).
#include <algorithm>
#include <cctype>
#include <string>

#include "common/mapped_file.h"
#include "checkpoint/file_names.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/source_kind.h"
#include "checkpoint/source_records.h"
#include "checkpoint/zip_container.h"
#include "pickle/legacy.h"
#include "pickle/torch_model.h"
#include "pickle/torch_save_pickle.h"
#include "pickle/unpickler.h"
#include "pt/pt_archive.h"
#include "pt/pt_format.h"
#include "safetensors/header.h"
#include "safetensors/header_writer.h"
#include "zckpt/container_writer.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

// Storage bytes are read and handed to the writer in pieces of this size, so progress and
// cancellation are responsive on a multi-GiB tensor and memory stays one piece.
constexpr uint64_t kPieceBytes = 16ull << 20;

using checkpoint::BaseName;

class Converter {
 public:
  Converter(const std::string& source, const std::string& destination, const ConvertOptions& options)
      : source_(source), options_(options), writer_(destination, options.writer) {}

  ConvertStats Run(const std::shared_ptr<const MappedFile>& file) {
    using checkpoint::WhyNotConverted;
    stats_.source_bytes = file->size();
    switch (checkpoint::SourceKind kind = checkpoint::DetectSource(file)) {
      case checkpoint::SourceKind::kTorchZip: ConvertZip(file); break;
      case checkpoint::SourceKind::kTorchLegacy: ConvertLegacy(*file); break;
      case checkpoint::SourceKind::kSafetensors: ConvertSafetensors(*file); break;
      case checkpoint::SourceKind::kUnknown:
        throw Error(ErrorKind::kNotContainer, WhyNotConverted(kind, source_) +
                                                  " (neither a zip archive, the legacy torch format nor a safetensors header)");
      case checkpoint::SourceKind::kZckpt:
        throw Error(ErrorKind::kNotContainer, WhyNotConverted(kind, source_));
      default:  // another checkpoint format: say which
        throw Error(ErrorKind::kUnsupported, WhyNotConverted(kind, source_));
    }
    writer_.SetMetadata(std::string(checkpoint::kKeyName), BaseName(source_));
    writer_.SetMetadata(std::string(checkpoint::kKeyBytes), std::to_string(file->size()));
    stats_.written = writer_.Commit();
    return stats_;
  }

 private:
  // The archive's side of checkpoint::ZipParts: records read privately (the object pickle kept is
  // the copy that was interpreted, not a second read of the file), storages checked against the
  // pickle's claim and streamed in pieces.
  class ArchiveParts final : public checkpoint::ZipParts {
   public:
    ArchiveParts(Converter& c, const pt::TorchArchive& archive, const MappedFile& file,
                 const std::vector<uint8_t>& object_pickle)
        : c_(c), archive_(archive), file_(file), object_pickle_(object_pickle) {}
    std::span<const uint8_t> Record(const std::string& name) override {
      if (name == checkpoint::kObjectPickleBlob) return object_pickle_;
      last_ = archive_.RecordCopy(name);
      return last_;
    }
    void WriteStorage(const pickle::TorchStorage& s, ContainerWriter& writer) override {
      std::span<const uint8_t> bytes = archive_.StorageRecord(s.key);
      if (bytes.size() != s.nbytes) {
        throw Error(ErrorKind::kCorrupt, "record data/" + s.key + " holds " + std::to_string(bytes.size()) +
                                             " bytes but the pickle claims " + std::to_string(s.nbytes) + " (" +
                                             std::to_string(s.numel) + " x " + std::string(DTypeName(s.dtype)) + ")");
      }
      (void)writer;  // the converter's own writer
      c_.AddStorage(checkpoint::StorageRecordOf(s), bytes, file_);
    }

   private:
    Converter& c_;
    const pt::TorchArchive& archive_;
    const MappedFile& file_;
    const std::vector<uint8_t>& object_pickle_;
    std::vector<uint8_t> last_;
  };

  void ConvertZip(const std::shared_ptr<const MappedFile>& file) {
    stats_.source_format = "zip";
    pt::TorchArchive archive(file);
    CheckArchiveNames(archive);
    const std::vector<uint8_t> object_pickle = archive.RecordCopy(checkpoint::kObjectPickleBlob);
    pickle::UnpickleResult tree = pickle::Unpickle(object_pickle, PickleOptions());
    pickle::TorchPickle model = pickle::InterpretTorchPickle(tree);
    BeginProgress(model.storages);
    ArchiveParts parts(*this, archive, *file, object_pickle);
    checkpoint::ZipCounts counts =
        checkpoint::WriteZipContainer(writer_, model, archive.RecordNames(), archive.prefix(), parts,
                                   ErrorKind::kCorrupt);  // the file's pickle names a record it lacks
    stats_.tensors = counts.tensors;  // storages are counted by AddStorage
  }

  // What export will write back must be an archive torch.load reads and that unpacks where it
  // should: refused here, rather than kept and refused at export.
  static void CheckArchiveNames(const pt::TorchArchive& archive) {
    if (!checkpoint::IsPlainArchivePath(archive.prefix()))
      throw Error(ErrorKind::kCorrupt, "the archive folder '" + archive.prefix() +
                                           "' is no plain folder name ('.', '..', a backslash or a NUL)");
    std::vector<std::string> names = archive.RecordNames();
    for (const std::string& name : names)
      if (!checkpoint::IsPlainArchivePath(name))
        throw Error(ErrorKind::kCorrupt, "record '" + archive.prefix() + "/" + name +
                                             "' is no plain relative path ('..', '.', an empty part, a backslash or a NUL)");
    if (!checkpoint::HasVersionRecord(names))
      throw Error(ErrorKind::kCorrupt, "no version record (torch.load refuses such an archive)");
  }

  void ConvertLegacy(const MappedFile& file) {
    stats_.source_format = "legacy";
    std::span<const uint8_t> bytes(file.data(), file.size());
    pickle::LegacyLayout layout = pickle::ReadLegacy(file, PickleOptions());  // private reads: no SIGBUS
    BeginProgress(layout.model.storages);
    // Data-section order, so export rebuilds the file byte for byte.
    for (const pickle::LegacyStorage& s : layout.storages) {
      AddStorage(NewStorage{s.key, s.location, s.dtype, /*untyped=*/false}, bytes.subspan(s.data_offset, s.nbytes), file);
    }
    stats_.tensors = checkpoint::AddTensorRecords(writer_, layout.model);
    writer_.AddBlob(std::string(checkpoint::kLegacyHeaderBlob), file.CopyView(bytes.subspan(0, layout.header_end)));
    writer_.AddBlob(std::string(checkpoint::kObjectPickleBlob),
                    file.CopyView(bytes.subspan(layout.object_pickle_offset, layout.object_pickle_size)));
    if (layout.data_end < bytes.size())
      writer_.AddBlob(std::string(checkpoint::kLegacyTrailerBlob), file.CopyView(bytes.subspan(layout.data_end)));
    writer_.SetMetadata(std::string(checkpoint::kKeyFormat), "legacy");
  }

  // safetensors: one storage per tensor, in byte-buffer order (the source is read front to
  // back), and the pickle torch.save writes for the dict safetensors.torch.load_file returns
  // (same order, same names), interpreted like any other so the tensor records are the ones a
  // converted torch.save file of that dict gets. The header is kept for the way back.
  void ConvertSafetensors(const MappedFile& file) {
    stats_.source_format = "safetensors";
    std::span<const uint8_t> bytes(file.data(), file.size());
    std::vector<uint8_t> json;  // read privately: a source truncated now is an error, not SIGBUS
    safetensors::Header header = safetensors::ReadFileHeader(file, &json);
    std::vector<pickle::DictTensor> dict;
    dict.reserve(header.tensors.size());
    for (size_t i = 0; i < header.tensors.size(); ++i) {
      const safetensors::TensorEntry& t = header.tensors[i];
      dict.push_back({t.name, std::to_string(i), t.dtype.dtype, t.TorchShape()});
    }
    const std::string pkl = pickle::TorchSavePickleOfTensorDict(dict);
    std::span<const uint8_t> pkl_bytes(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size());
    pickle::TorchPickle model = pickle::InterpretTorchPickle(pickle::Unpickle(pkl_bytes));
    if (model.storages.size() != header.tensors.size())
      throw Error(ErrorKind::kCorrupt, "safetensors: " + std::to_string(header.tensors.size()) + " tensors but " +
                                           std::to_string(model.storages.size()) + " storages");
    BeginProgress(model.storages);
    for (size_t i = 0; i < model.storages.size(); ++i) {
      const pickle::TorchStorage& s = model.storages[i];
      const safetensors::TensorEntry& t = header.tensors[i];
      if (s.key != dict[i].storage_key || s.nbytes != t.bytes())  // the pickle writer's own promise
        throw Error(ErrorKind::kCorrupt, "safetensors: tensor '" + t.name + "' does not match its storage");
      AddStorage(checkpoint::StorageRecordOf(s), bytes.subspan(header.data_offset + t.begin, t.bytes()), file);
    }
    stats_.tensors = checkpoint::AddTensorRecords(writer_, model);
    writer_.AddBlob(std::string(checkpoint::kObjectPickleBlob), pkl_bytes);
    writer_.AddBlob(std::string(checkpoint::kSafetensorsHeaderBlob), json);
    writer_.SetMetadata(std::string(checkpoint::kKeyFormat), "safetensors");
    if (header.has_metadata)
      writer_.SetMetadata(std::string(checkpoint::kKeySafetensorsMetadata), safetensors::FormatMetadataJson(header.metadata));
  }

  // The allowlist plus what the caller allows: the pickle is kept for zckpt.load and export.
  pickle::UnpickleOptions PickleOptions() const {
    pickle::UnpickleOptions o;
    o.allow_globals = options_.allow_globals;
    return o;
  }

  void BeginProgress(const std::vector<pickle::TorchStorage>& storages) {
    for (const auto& s : storages) total_ += s.nbytes;
    Report();
  }

  void Report() {
    if (options_.progress) options_.progress(done_, total_);
  }

  // `bytes` (a view of the source's mapping) is read piece by piece with pread into a buffer of
  // ours (MappedFile::ReadView): the source's pages never count in RSS, and a source truncated
  // meanwhile is Error(kIo) naming it, not SIGBUS.
  void AddStorage(const NewStorage& ns, std::span<const uint8_t> bytes, const MappedFile& file) {
    writer_.BeginStorage(ns, bytes.size());
    for (uint64_t off = 0; off < bytes.size(); off += kPieceBytes) {
      if (options_.cancel && options_.cancel->load()) throw Error(ErrorKind::kCancelled, "conversion cancelled");
      uint64_t n = std::min<uint64_t>(kPieceBytes, bytes.size() - off);
      piece_.resize(std::max<uint64_t>(piece_.size(), n));
      file.ReadView(bytes.subspan(off, n), piece_.data());
      writer_.AppendStorage({piece_.data(), n});
      done_ += n;
      Report();
    }
    writer_.EndStorage();
    stats_.storages++;
  }

  std::string source_;
  const ConvertOptions& options_;
  ContainerWriter writer_;
  ConvertStats stats_;
  uint64_t done_ = 0, total_ = 0;
  std::vector<uint8_t> piece_;
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

bool IsCheckpointName(const std::string& name) {
  std::string lower = checkpoint::AsciiLower(name);
  for (const char* ext : {".pt", ".pth", ".bin", ".safetensors"}) {
    std::string e(ext);
    if (lower.size() > e.size() && lower.compare(lower.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

std::string DefaultDestination(const std::string& source) {
  std::string base = BaseName(source);
  size_t dot = base.rfind('.');
  if (dot != std::string::npos && dot > 0 && IsCheckpointName(base))
    return source.substr(0, source.size() - (base.size() - dot)) + ".zckpt";
  return source + ".zckpt";
}

}  // namespace zckpt
