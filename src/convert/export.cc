// zckpt export: container -> `.pt` (export_safetensors.cc: -> `.safetensors`).
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "convert/source_records.h"
#include "convert/storage_stream.h"
#include "convert/export_safetensors.h"
#include "pt/zip_writer.h"
#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

using convert::CheckedBlob;
using convert::StreamStorage;

void ExportZip(const Container& c, const std::string& destination) {
  auto prefix = c.FindMetadata(convert::kKeyPrefix);
  auto records = c.FindMetadata(convert::kKeyRecords);
  if (!records) {
    // A container not made by `zckpt convert`: the object pickle plus its storages.
    if (!c.FindBlob(convert::kObjectPickleBlob))
      throw Error(ErrorKind::kInvalidArgument, c.path() + ": no object pickle (data.pkl) to export");
  }
  std::vector<std::string> names;
  // Records written as they are, not from the container: what torch.save adds around the pickle
  // and the storages, for containers that kept no archive of their own (torch.load needs
  // `version`).
  std::map<std::string, std::string> literal;
  if (records) {
    names = convert::SplitRecords(*records);
  } else {
    literal = {{".format_version", "1"}, {".storage_alignment", "64"}, {"byteorder", "little"}, {"version", "3\n"}};
    names = {std::string(convert::kObjectPickleBlob), ".format_version", ".storage_alignment", "byteorder"};
    for (uint32_t s = 0; s < c.storage_count(); ++s)
      names.push_back(std::string(convert::kStorageRecordPrefix) + std::string(c.storage(s).key));
    names.emplace_back("version");
  }
  // Storage records (`data/<key>` of a storage) are streamed from the storage, the rest are
  // blobs. Every name is resolved before anything is written: a container whose record list
  // names something it does not hold fails at once, not after gigabytes.
  const std::string named_by = "metadata '" + std::string(convert::kKeyRecords) + "'";
  std::vector<std::optional<uint32_t>> storage_of(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    if (name.rfind(convert::kStorageRecordPrefix, 0) == 0)
      storage_of[i] = c.FindStorage(std::string_view(name).substr(convert::kStorageRecordPrefix.size()));
    if (!storage_of[i] && !literal.count(name) && !c.FindBlob(name)) (void)CheckedBlob(c, name, named_by);  // throws kCorrupt
  }
  pt::TorchZipWriter zip(destination, prefix ? std::string(*prefix) : std::string("archive"));
  for (size_t i = 0; i < names.size(); ++i) {
    if (storage_of[i]) {
      zip.BeginRecord(names[i], c.storage(*storage_of[i]).raw_bytes);
      StreamStorage(c, *storage_of[i], [&](std::span<const uint8_t> piece) { zip.Append(piece); });
      zip.EndRecord();
    } else if (auto it = literal.find(names[i]); it != literal.end()) {
      zip.WriteRecord(names[i], std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(it->second.data()), it->second.size()));
    } else {
      zip.WriteRecord(names[i], CheckedBlob(c, names[i], named_by));
    }
  }
  zip.Commit();
}

void ExportLegacy(const Container& c, const std::string& destination) {
  const std::string legacy = "metadata '" + std::string(convert::kKeyFormat) + "' = legacy";
  auto header = CheckedBlob(c, convert::kLegacyHeaderBlob, legacy);
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
  if (c.FindBlob(convert::kLegacyTrailerBlob)) {
    auto trailer = CheckedBlob(c, convert::kLegacyTrailerBlob, legacy);
    out.Write(trailer.data(), trailer.size());
  }
  out.Commit();
}

}  // namespace

void ExportFile(const std::string& source, const std::string& destination, ExportFormat format) {
  auto c = Container::Open(source);
  if (format == ExportFormat::kSafetensors) return convert::ExportSafetensors(*c, destination);
  auto fmt = c->FindMetadata(convert::kKeyFormat);
  if (fmt && *fmt == "legacy") ExportLegacy(*c, destination);
  else ExportZip(*c, destination);
}

}  // namespace zckpt
