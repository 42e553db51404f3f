// torch.distributed.checkpoint (DCP) folders without Python or torch: convert a folder written by
// DCP's FileSystemWriter (`.metadata` + `*.distcp`) into zckpt's DCP layout (one container per
// `.distcp` file, every piece checksummed, readable by zckpt.dcp.ZckptStorageReader) and give it
// back byte for byte; VerifyPath (zckpt/verify.h) verifies a folder of either layout as a whole.
// The layouts are described in format-spec/folders.md. `.metadata` is read by zckpt's restricted
// pickle interpreter with an allowlist of DCP's metadata classes: nothing in it runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/verify.h"

namespace zckpt {

// True when `dir` is a DCP checkpoint folder: `.metadata` beside `*.distcp` shards or zckpt's
// `__R_N.zckpt` containers (format-spec/folders.md).
bool IsDcpFolder(const std::string& dir);

struct DcpConvertStats {
  uint64_t files = 0;        // .distcp files converted
  uint64_t tensors = 0;      // tensor pieces
  uint64_t bytes_items = 0;  // BytesIO items (each vetted by zckpt's interpreter)
  uint64_t copied = 0;       // other files copied (.metadata among them)
  uint64_t source_bytes = 0;
  uint64_t written_bytes = 0;
};

// Converts every `.distcp` file `.metadata` names into `<stem>.zckpt` under `destination`
// (created if needed) and copies every other file of the folder. Each container appears only
// complete. BytesIO items are read under zckpt's allowlist plus options.allow_globals. Throws
// Error: kUnsafe (a BytesIO item naming a refused global, `.metadata` naming a class not DCP's),
// kCorrupt (metadata and files disagree: ranges past the end or overlapping, an item that is not
// one tensor archive, dtype/shape other than the metadata's), kUnsupported (stream transforms,
// SAFETENSORS serialization), kInvalidArgument (already zckpt's layout), kIo.
DcpConvertStats ConvertDcpFolder(const std::string& source, const std::string& destination,
                                 const ConvertOptions& options = {});
// The files ConvertDcpFolder(source, destination) would write (reads `.metadata`; throws as it
// does), for a caller that refuses to overwrite.
std::vector<std::string> DcpConvertOutputs(const std::string& source, const std::string& destination);

// Writes a converted folder back as FileSystemWriter's layout: each container made by
// ConvertDcpFolder becomes its `.distcp` file byte for byte (every chunk and blob checked on the
// way), every other file is copied. A folder written by ZckptStorageWriter has no `.distcp`
// layout to give back: Error(kInvalidArgument) saying so. Before anything is written, every
// BytesIO item (DCP's planner unpickles them without weights_only) is read by zckpt's
// interpreter under its allowlist plus `allow_globals` ("module.name"): Error(kUnsafe) naming a
// refused global.
void ExportDcpFolder(const std::string& source, const std::string& destination,
                     const std::vector<std::string>& allow_globals = {});
// The files ExportDcpFolder(source, destination) would write (opens every container; throws as
// it does).
std::vector<std::string> DcpExportOutputs(const std::string& source, const std::string& destination);

// A folder of either layout is verified as a whole by VerifyPath (zckpt/verify.h).

}  // namespace zckpt
