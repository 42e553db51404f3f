// zckpt export: container -> `.pt`.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "convert/source_records.h"
#include "pt/zip_writer.h"
#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

// Streams storage `s` (any codec) into `sink` chunk by chunk, checksums checked: a corrupt
// container must not turn into a plausible-looking .pt.
template <typename Sink>
void StreamStorage(const Container& c, uint32_t s, Sink&& sink) {
  StorageInfo info = c.storage(s);
  std::vector<uint8_t> buffer;
  for (uint64_t k = 0; k < info.chunk_count; ++k) {
    uint64_t i = info.first_chunk + k;
    format::ChunkRecord ch = c.chunk(i);
    buffer.resize(ch.raw_bytes);
    c.ReadChunk(i, buffer.data(), /*check=*/true);
    sink(std::span<const uint8_t>(buffer.data(), buffer.size()));
    if (ch.codec == static_cast<uint8_t>(format::Codec::kNone)) {
      c.file().Release(ch.offset, ch.stored_bytes);  // keep RSS bounded on multi-GiB files
    }
  }
}

// A blob the container's own metadata says it holds (`named_by`): one that is missing makes the
// container damaged or forged (kCorrupt, exit 1), not the caller's mistake.
std::span<const uint8_t> CheckedBlob(const Container& c, std::string_view name, std::string_view named_by) {
  auto blob = c.FindBlob(name);
  if (!blob)
    throw Error(ErrorKind::kCorrupt, c.path() + ": corrupt: " + std::string(named_by) + " names '" + std::string(name) +
                                         "', but the container holds no blob (or storage) of that name");
  return c.CheckedBlobBytes(*blob);
}

void ExportZip(const Container& c, const std::string& destination) {
  auto prefix = c.FindMetadata(convert::kKeyPrefix);
  auto records = c.FindMetadata(convert::kKeyRecords);
  if (!records) {
    // A container not made by `zckpt convert`: the object pickle plus its storages.
    if (!c.FindBlob(convert::kObjectPickleBlob))
      throw Error(ErrorKind::kInvalidArgument, c.path() + ": no object pickle (data.pkl) to export");
  }
  std::vector<std::string> names;
  if (records) {
    names = convert::SplitRecords(*records);
  } else {
    names.emplace_back(convert::kObjectPickleBlob);
    for (uint32_t s = 0; s < c.storage_count(); ++s)
      names.push_back(std::string(convert::kStorageRecordPrefix) + std::string(c.storage(s).key));
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
    if (!storage_of[i] && !c.FindBlob(name)) (void)CheckedBlob(c, name, named_by);  // throws kCorrupt
  }
  pt::TorchZipWriter zip(destination, prefix ? std::string(*prefix) : std::string("archive"));
  for (size_t i = 0; i < names.size(); ++i) {
    if (storage_of[i]) {
      zip.BeginRecord(names[i], c.storage(*storage_of[i]).raw_bytes);
      StreamStorage(c, *storage_of[i], [&](std::span<const uint8_t> piece) { zip.Append(piece); });
      zip.EndRecord();
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

void ExportFile(const std::string& source, const std::string& destination) {
  auto c = Container::Open(source);
  auto fmt = c->FindMetadata(convert::kKeyFormat);
  if (fmt && *fmt == "legacy") ExportLegacy(*c, destination);
  else ExportZip(*c, destination);
}

}  // namespace zckpt
