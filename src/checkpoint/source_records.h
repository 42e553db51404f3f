// How a container remembers the `.pt` it came from, so export can give it back (format-spec/source-metadata.md).
//
// zip sources: every archive record is kept, storages as storages (`data/<key>`) and the rest
// as blobs named like the record; the archive order is kept in `zckpt.source.records`.
// safetensors sources: the header (its N JSON bytes, padding included) is one blob, the tensors
// are storages in byte-buffer order, and `data.pkl` is the pickle torch.save writes for the dict
// safetensors.torch.load_file returns; export --format safetensors gives the file back.
// legacy sources: the bytes before the data section (its five pickles) are one blob, and the
// storages are written in data-section order, so export can rebuild the file byte for byte.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "zckpt/format.h"

namespace zckpt::checkpoint {

inline constexpr std::string_view kKeyFormat = "zckpt.source.format";    // "zip" | "legacy" | "safetensors"
inline constexpr std::string_view kKeyPrefix = "zckpt.source.prefix";    // zip record prefix
// zip record names in archive order, each followed by a NUL: names may hold any other byte
// (a newline included), and the zip reader refuses names with a NUL.
inline constexpr std::string_view kKeyRecords = "zckpt.source.records";
inline constexpr std::string_view kKeyName = "zckpt.source.name";
inline constexpr std::string_view kKeyBytes = "zckpt.source.bytes";
// safetensors sources: the header's "__metadata__" as a JSON object, when it has one (informative:
// the header blob is what export writes).
inline constexpr std::string_view kKeySafetensorsMetadata = "zckpt.source.metadata";
inline constexpr std::string_view kSafetensorsHeaderBlob = "safetensors.header";
inline constexpr std::string_view kLegacyHeaderBlob = "legacy.header";
inline constexpr std::string_view kLegacyTrailerBlob = "legacy.trailer";  // bytes after the data section
inline constexpr std::string_view kObjectPickleBlob = format::kObjectPickleBlob;
inline constexpr std::string_view kStorageRecordPrefix = "data/";

std::string JoinRecords(const std::vector<std::string>& names);
std::vector<std::string> SplitRecords(std::string_view joined);

// A record name (or the archive's folder) that unpacks inside the folder it is unpacked into:
// relative, '/'-separated, no empty, `.` or `..` part, no backslash (a separator to some unzip
// tools) or NUL. Other bytes, a newline included, are legal in a zip name and torch reads them.
// Convert refuses sources, and export containers, whose names are not.
bool IsPlainArchivePath(std::string_view name);
// True when `names` hold the record without which torch.load refuses an archive.
bool HasVersionRecord(const std::vector<std::string>& names);

}  // namespace zckpt::checkpoint
