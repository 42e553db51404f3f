#include "pt/pt_archive.h"

#include <algorithm>

#include "zckpt/error.h"

namespace zckpt::pt {

namespace {

constexpr std::string_view kDataPickle = "data.pkl";
constexpr std::string_view kByteOrder = "byteorder";
constexpr std::string_view kStoragePrefix = "data/";
// torch.jit.save archives carry their constants in a second pickle.
constexpr std::string_view kTorchScriptConstants = "constants.pkl";

// Refuses anything that is not a zip before the zip parser sees it, so a legacy file gets a
// message about its format rather than "no end of central directory".
std::shared_ptr<const MappedFile> RequireZipFormat(std::shared_ptr<const MappedFile> file) {
  if (!file) throw Error(ErrorKind::kInvalidArgument, "TorchArchive: null mapping");
  std::span<const uint8_t> head(file->data(), std::min<size_t>(file->size(), kPtFormatProbeBytes));
  switch (DetectPtFormat(head)) {
    case PtFormat::kZip:
      return file;
    case PtFormat::kLegacy:
      throw Error(ErrorKind::kUnsupported,
                  file->path() + ": legacy torch.save format (torch < 1.6 or _use_new_zipfile_serialization=False), "
                                 "not a zip archive");
    case PtFormat::kLegacyTar:
      throw Error(ErrorKind::kUnsupported, file->path() + ": tar-based torch.save format (torch <= 0.3) is not supported");
    case PtFormat::kUnknown:
      break;
  }
  throw Error(ErrorKind::kNotContainer, file->path() + ": not a .pt file (neither a zip archive nor a legacy torch pickle)");
}

}  // namespace

TorchArchive::TorchArchive(std::shared_ptr<const MappedFile> file) : zip_(RequireZipFormat(std::move(file))) {
  Validate();
}

TorchArchive TorchArchive::Open(const std::string& path) {
  return TorchArchive(std::make_shared<const MappedFile>(path));
}

// torch takes the prefix from the first entry, up to its first '/', and only ever looks up
// "<prefix>/<name>"; we also require every entry to share it, so no entry goes unseen.
void TorchArchive::Validate() {
  const auto& entries = zip_.entries();
  if (entries.empty()) throw Error(ErrorKind::kCorrupt, path() + ": zip archive has no entries");
  size_t slash = entries[0].name.find('/');
  if (slash == std::string::npos || slash == 0)
    throw Error(ErrorKind::kCorrupt, path() + ": first entry '" + PrintableEntryName(entries[0].name) + "' is not inside a folder");
  prefix_ = entries[0].name.substr(0, slash);
  const std::string folder = prefix_ + "/";

  records_.reserve(entries.size());
  for (const ZipEntry& e : entries) {
    if (e.name.size() <= folder.size() || e.name.compare(0, folder.size(), folder) != 0)
      throw Error(ErrorKind::kCorrupt, path() + ": entry '" + PrintableEntryName(e.name) + "' is outside the archive folder '" + PrintableEntryName(folder) + "'");
    by_name_.emplace(e.name.substr(folder.size()), records_.size());
    records_.push_back(TorchRecord{e.name.substr(folder.size()), &e});
  }

  if (FindRecord(kTorchScriptConstants))
    throw Error(ErrorKind::kUnsupported, path() + ": TorchScript archive (torch.jit.save, has constants.pkl), "
                                                  "not a torch.save checkpoint; load it with torch.jit.load");
  if (!FindRecord(kDataPickle)) throw Error(ErrorKind::kCorrupt, path() + ": no " + folder + "data.pkl record");
  if (FindRecord(kByteOrder)) {
    std::span<const uint8_t> order = Record(kByteOrder);
    std::string_view value(reinterpret_cast<const char*>(order.data()), order.size());
    if (value == "big")
      throw Error(ErrorKind::kUnsupported, path() + ": storages are big-endian (byteorder \"big\"); not supported");
    if (value != "little")
      throw Error(ErrorKind::kCorrupt, path() + ": byteorder record holds neither \"little\" nor \"big\"");
  }
  little_endian_ = true;
}

std::vector<std::string> TorchArchive::RecordNames() const {
  std::vector<std::string> names;
  names.reserve(records_.size());
  for (const TorchRecord& r : records_) names.push_back(r.name);
  return names;
}

const TorchRecord* TorchArchive::FindRecord(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &records_[it->second];
}

std::span<const uint8_t> TorchArchive::Record(std::string_view name) const {
  const TorchRecord* r = FindRecord(name);
  if (!r) throw Error(ErrorKind::kCorrupt, path() + ": record '" + prefix_ + "/" + std::string(name) + "' is missing");
  return zip_.Data(*r->entry);
}

std::vector<uint8_t> TorchArchive::RecordCopy(std::string_view name) const {
  return zip_.file()->CopyView(Record(name));
}

std::span<const uint8_t> TorchArchive::StorageRecord(std::string_view key) const {
  return Record(std::string(kStoragePrefix) + std::string(key));
}

bool TorchArchive::IsStorageRecord(std::string_view name) {
  return name.size() > kStoragePrefix.size() && name.substr(0, kStoragePrefix.size()) == kStoragePrefix;
}

}  // namespace zckpt::pt
