// zckpt export: container -> `.pt` (export_safetensors.cc: -> `.safetensors`).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "convert/export_safetensors.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/source_records.h"
#include "checkpoint/storage_stream.h"
#include "pickle/legacy.h"
#include "pt/zip_writer.h"
#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

using checkpoint::CheckedBlob;
using checkpoint::StreamStorage;

[[noreturn]] void Refuse(const Container& c, const std::string& what) {
  throw Error(ErrorKind::kCorrupt, c.path() + ": corrupt: " + what);
}

// The small records torch.save writes besides data.pkl and the storages, for a container that
// does not list its source's records.
const std::vector<std::pair<std::string, std::string>>& TorchSaveRecords() {
  static const std::vector<std::pair<std::string, std::string>> records = {
      {".format_version", "1"}, {".storage_alignment", "64"}, {"byteorder", "little"}, {"version", "3\n"}};
  return records;
}

void ExportZip(const Container& c, const std::string& destination, const ExportOptions& options) {
  auto prefix_meta = c.FindMetadata(checkpoint::kKeyPrefix);
  auto records = c.FindMetadata(checkpoint::kKeyRecords);
  const std::string named_by = "metadata '" + std::string(checkpoint::kKeyRecords) + "'";
  if (!records && !c.FindBlob(checkpoint::kObjectPickleBlob))
    throw Error(ErrorKind::kInvalidArgument, c.path() + ": no object pickle (data.pkl) to export");
  const std::string prefix = prefix_meta ? std::string(*prefix_meta) : std::string("archive");
  if (!checkpoint::IsPlainArchivePath(prefix) || prefix.find('/') != std::string::npos)
    Refuse(c, "metadata '" + std::string(checkpoint::kKeyPrefix) + "' names the archive folder '" + prefix +
                  "', which is no plain folder name (absolute, '..', '.', a '/', a backslash or a NUL)");

  // What to write, in order: a record streamed from a storage, a blob, or (for a container that
  // does not list its source's records) the small records torch.save writes.
  std::vector<std::string> names;
  std::map<std::string, std::string> synthesized;
  if (records) {
    names = checkpoint::SplitRecords(*records);
  } else {
    names.emplace_back(checkpoint::kObjectPickleBlob);
    for (size_t i = 0; i + 1 < TorchSaveRecords().size(); ++i) {
      names.push_back(TorchSaveRecords()[i].first);
      synthesized.insert(TorchSaveRecords()[i]);
    }
    for (uint32_t s = 0; s < c.storage_count(); ++s)
      names.push_back(std::string(checkpoint::kStorageRecordPrefix) + std::string(c.storage(s).key));
    names.push_back(TorchSaveRecords().back().first);
    synthesized.insert(TorchSaveRecords().back());
  }
  // Every name is resolved and judged before anything is written: a container whose record list
  // names something it does not hold, or a record torch.load would mistake, fails at once, not
  // after gigabytes.
  std::vector<std::optional<uint32_t>> storage_of(names.size());
  bool has_pickle = false;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    if (!checkpoint::IsPlainArchivePath(name))
      Refuse(c, named_by + " names the record '" + name +
                    "', which is no plain relative path (absolute, '..', '.', an empty part, a backslash or a NUL)");
    if (name == "constants.pkl")
      Refuse(c, named_by + " names 'constants.pkl', which would make torch.load read the archive as TorchScript (torch.jit.load)");
    has_pickle = has_pickle || name == checkpoint::kObjectPickleBlob;
    if (synthesized.count(name)) continue;
    if (name.rfind(checkpoint::kStorageRecordPrefix, 0) == 0)
      storage_of[i] = c.FindStorage(std::string_view(name).substr(checkpoint::kStorageRecordPrefix.size()));
    if (!storage_of[i] && !c.FindBlob(name)) (void)CheckedBlob(c, name, named_by);  // throws kCorrupt
  }
  if (!has_pickle) Refuse(c, named_by + " lacks 'data.pkl', without which torch.load refuses the archive");
  if (!checkpoint::HasVersionRecord(names)) Refuse(c, named_by + " lacks 'version', without which torch.load refuses the archive");

  // What torch.load will unpickle: vetted, and held against the index.
  checkpoint::PickleReadOptions read;
  read.allow_globals = options.allow_globals;
  auto pickle = checkpoint::ReadObjectPickle(c, read);
  std::set<std::string> exported(names.begin(), names.end());
  for (const pickle::TorchStorage& s : pickle->model.storages)
    if (!exported.count(std::string(checkpoint::kStorageRecordPrefix) + s.key))
      Refuse(c, named_by + " lacks 'data/" + s.key + "', a storage the object pickle names");

  pt::TorchZipWriter zip(destination, prefix);
  for (size_t i = 0; i < names.size(); ++i) {
    if (storage_of[i]) {
      zip.BeginRecord(names[i], c.storage(*storage_of[i]).raw_bytes);
      StreamStorage(c, *storage_of[i], [&](std::span<const uint8_t> piece) { zip.Append(piece); });
      zip.EndRecord();
    } else if (auto it = synthesized.find(names[i]); it != synthesized.end()) {
      zip.WriteRecord(names[i], std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(it->second.data()), it->second.size()));
    } else if (names[i] == checkpoint::kObjectPickleBlob) {
      zip.WriteRecord(names[i], pickle->bytes);  // the bytes vetted above, not a second read
    } else {
      zip.WriteRecord(names[i], CheckedBlob(c, names[i], named_by));
    }
  }
  zip.Commit();
}

// The legacy header is five pickles torch.load unpickles one after the other: each is vetted as
// the object pickle is, the object pickle in it must be the container's data.pkl (checked
// against the index), and its key list must match the storages export writes after it, in
// order and size.
void VetLegacyHeader(const Container& c, std::span<const uint8_t> header, const ExportOptions& options) {
  checkpoint::PickleReadOptions read;
  read.allow_globals = options.allow_globals;
  auto pickle = checkpoint::ReadObjectPickle(c, read);
  if (!pickle) (void)CheckedBlob(c, checkpoint::kObjectPickleBlob, "metadata '" + std::string(checkpoint::kKeyFormat) + "' = legacy");
  pickle::LegacyLayout layout;
  try {
    layout = pickle::ParseLegacyHeader(header, read.Unpickle());
  } catch (const Error& e) {
    throw Error(e.kind(), c.path() + ": blob '" + std::string(checkpoint::kLegacyHeaderBlob) + "': " + e.what());
  }
  const std::string blob = "blob '" + std::string(checkpoint::kLegacyHeaderBlob) + "'";
  if (layout.header_end != header.size())
    Refuse(c, blob + " holds " + std::to_string(header.size() - layout.header_end) + " bytes after its five pickles");
  std::span<const uint8_t> object = header.subspan(layout.object_pickle_offset, layout.object_pickle_size);
  if (!std::equal(object.begin(), object.end(), pickle->bytes.begin(), pickle->bytes.end()))
    Refuse(c, blob + " holds another object pickle than blob '" + std::string(checkpoint::kObjectPickleBlob) + "'");
  if (layout.model.storages.size() != c.storage_count())
    Refuse(c, blob + " lists " + std::to_string(layout.model.storages.size()) + " storages, the index " +
                  std::to_string(c.storage_count()));
  for (uint32_t s = 0; s < c.storage_count(); ++s) {
    const pickle::TorchStorage& listed = layout.model.storages[s];
    StorageInfo info = c.storage(s);
    if (listed.key != info.key || listed.nbytes != info.raw_bytes)
      Refuse(c, blob + " lists storage '" + listed.key + "' (" + std::to_string(listed.nbytes) + " bytes) where the index has '" +
                    std::string(info.key) + "' (" + std::to_string(info.raw_bytes) + " bytes)");
  }
}

void ExportLegacy(const Container& c, const std::string& destination, const ExportOptions& options) {
  const std::string legacy = "metadata '" + std::string(checkpoint::kKeyFormat) + "' = legacy";
  auto header = CheckedBlob(c, checkpoint::kLegacyHeaderBlob, legacy);
  VetLegacyHeader(c, header, options);
  AtomicFile out(destination);
  out.Write(header.data(), header.size());
  for (uint32_t s = 0; s < c.storage_count(); ++s) {
    StorageInfo info = c.storage(s);
    uint32_t elem = DTypeSize(info.dtype);
    int64_t numel = static_cast<int64_t>(info.raw_bytes / (elem ? elem : 1));
    uint8_t count[8];
    for (int b = 0; b < 8; ++b) count[b] = static_cast<uint8_t>(static_cast<uint64_t>(numel) >> (8 * b));
    out.Write(count, sizeof count);
    StreamStorage(c, s, [&](std::span<const uint8_t> piece) { out.Write(piece.data(), piece.size()); });
  }
  if (c.FindBlob(checkpoint::kLegacyTrailerBlob)) {
    auto trailer = CheckedBlob(c, checkpoint::kLegacyTrailerBlob, legacy);
    out.Write(trailer.data(), trailer.size());
  }
  out.Commit();
}

}  // namespace

void ExportFile(const std::string& source, const std::string& destination, const ExportOptions& options) {
  auto c = Container::Open(source);
  if (options.format == ExportFormat::kSafetensors) return convert::ExportSafetensors(*c, destination, options.allow_globals);
  auto fmt = c->FindMetadata(checkpoint::kKeyFormat);
  if (fmt && *fmt == "legacy") ExportLegacy(*c, destination, options);
  else ExportZip(*c, destination, options);
}

}  // namespace zckpt
