// What a file handed to `zckpt convert` is, told from its bytes (and, for the formats that
// have no magic of their own, its name), so that a file in another checkpoint format is named
// for what it is instead of being reported as a corrupt .pt.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "zckpt/error.h"

namespace zckpt::checkpoint {

enum class SourceKind {
  // Converted.
  kTorchZip,     // torch.save, torch >= 1.6
  kTorchLegacy,  // torch.save, legacy format
  kSafetensors,
  // Recognised, not converted.
  kTorchLegacyTar,  // torch <= 0.3
  kZckpt,           // already a container
  kTorchScript,     // torch.jit.save (a zip with constants.pkl / code/)
  kDcpShard,        // torch.distributed.checkpoint: a *.distcp file (its folder converts: dcp.h)
  kDcpMetadata,     // torch.distributed.checkpoint: the folder's .metadata (likewise)
  kGguf,            // llama.cpp / ggml
  kNumpyNpz,        // numpy.savez
  kNumpyNpy,        // numpy.save
  kUnknown,         // none of these
};

// Classifies a mapped file (never throws; a zip whose directory cannot be read counts as a
// torch.save zip, so the converter reports what is wrong with it).
SourceKind DetectSource(const std::shared_ptr<const MappedFile>& file);
// Maps `path` and classifies it. Throws Error(kIo) when it cannot be read.
SourceKind DetectSource(const std::string& path);

// True for the kinds `zckpt convert` converts.
bool IsConvertible(SourceKind kind);
// Short name: "torch.save (zip)", "safetensors", "TorchScript archive", ...
const char* SourceKindName(SourceKind kind);
// For a kind that is not converted: what the file at `path` is and what to do instead, one
// sentence, e.g. "a TorchScript archive (torch.jit.save), not a torch.save checkpoint: load it
// with torch.jit.load; ...". `path` names the folder in the advice for DCP files.
std::string WhyNotConverted(SourceKind kind, const std::string& path = "");

// True when `dir` holds a torch.distributed.checkpoint (format-spec/folders.md): a `.metadata` file and,
// beside it, `*.distcp` shards (FileSystemWriter's layout) or DCP-named containers `__R_N.zckpt`
// (zckpt's layout: written by zckpt.dcp.ZckptStorageWriter or converted by `zckpt convert`). A
// `.metadata` among other files (a folder of containers named otherwise) is not DCP's. `dir`
// may be an object folder (s3://BUCKET/PREFIX: one listing).
bool IsDcpFolder(const std::string& dir);
// Which of the two: kDistcp when any `.distcp` shard is there (`zckpt convert` converts it).
enum class DcpLayout { kNone, kDistcp, kContainers };
DcpLayout DcpFolderLayout(const std::string& dir);
// The same from the names of a folder's own files (a listing already made).
DcpLayout DcpLayoutOf(const std::vector<std::string>& names);
// What to do with one file of a DCP folder given alone: the folder is the checkpoint.
std::string DcpAdvice(const std::string& dir);

// For a file that is not a container but was given where one is expected (`zckpt load x.pt`,
// `zckpt.load("x.pt")`): a hint to convert it first; nullopt when it is not a format zckpt
// converts. Never throws.
std::optional<std::string> NotAContainerHint(const std::string& path);
// `e` with that hint appended ("\n  hint: ..."), when `e` is a kNotContainer error about `path`
// and there is one; `e` unchanged otherwise.
Error WithNotAContainerHint(const Error& e, const std::string& path);

}  // namespace zckpt::checkpoint
