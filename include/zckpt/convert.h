// `.pt` / `.safetensors` <-> `.zckpt`: the converter and the exporter. No torch and no Python: the source's
// pickle is read by zckpt's restricted interpreter, which executes nothing and refuses globals
// not known to be data (Error kUnsafe; src/pickle/safety.h), and kept verbatim for the way back.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zckpt/container_writer.h"

namespace zckpt {

struct ConvertOptions {
  WriterOptions writer;  // chunk size, alignment, zstd level, threads
  // Globals ("module.name") the pickle may name besides zckpt's allowlist of data globals
  // (src/pickle/allowlist.h): classes of the caller's own that the caller trusts. Globals on the
  // deny list stay refused whatever is listed here.
  std::vector<std::string> allow_globals;
  // Called as storage bytes are written: (bytes done, bytes total) for the current file.
  std::function<void(uint64_t, uint64_t)> progress;
  const std::atomic<bool>* cancel = nullptr;
};

struct ConvertStats {
  std::string source_format;  // "zip", "legacy" or "safetensors"
  uint64_t source_bytes = 0;
  uint64_t storages = 0;
  uint64_t tensors = 0;
  WriterStats written;
};

// Converts one `.pt` file (zip or legacy format, torch 1.x or 2.x) or safetensors file (every
// offset of its header checked; the container gets the pickle torch.save writes for the dict
// safetensors.torch.load_file returns, and keeps the header so export gives the file back).
// Nothing appears at `destination` unless the whole conversion succeeds. Throws Error: kUnsafe
// (a global off the allowlist and not in options.allow_globals, or on the deny list, naming it
// and its pickle offset), kCorrupt (malformed source, or an archive export could not write
// back), kNotContainer (neither, or already a container), kUnsupported (another checkpoint
// format, named: TorchScript, torch.distributed.checkpoint, GGUF, numpy; big-endian, ...), kIo.
ConvertStats ConvertFile(const std::string& source, const std::string& destination, const ConvertOptions& options);

// The destination `zckpt convert SRC.pt` uses without -o: SRC with `.pt`/`.pth`/`.bin`/`.safetensors`
// replaced by `.zckpt` (appended when SRC has another extension).
std::string DefaultDestination(const std::string& source);

// True for names `zckpt convert DIR` converts (.pt, .pth, .bin, .safetensors).
bool IsCheckpointName(const std::string& name);

enum class ExportFormat {
  kTorch,        // a torch.save file
  kSafetensors,  // a safetensors file
};

struct ExportOptions {
  ExportFormat format = ExportFormat::kTorch;
  std::vector<std::string> allow_globals;  // as ConvertOptions::allow_globals
};

// kTorch: writes the container back as the `.pt` it came from: the kept object pickle and every
// record of the source archive (zip), or the kept legacy header and the storages (legacy, then
// byte-identical to the source); a container from a safetensors file becomes the torch.save
// file of the dict safetensors.torch.load_file returns. torch.load reads it to an object equal
// to the original.
// kSafetensors: a container from a safetensors file gives that file back byte for byte; one
// from a torch.save file of a flat dict of tensors gives what safetensors.torch.save_file writes
// for that dict; anything else is refused (kUnsupported) naming what safetensors cannot hold.
// Nothing is written until the object pickle has been vetted: read by zckpt's interpreter under
// the allowlist plus options.allow_globals and held against the index (convert/object_pickle.h),
// every pickle of a legacy header likewise; and, for kTorch, the archive checked complete and
// safe to unpack: record names and folder plain relative paths (no `..`, no absolute path), the
// storages the pickle names present, `version` present, no TorchScript `constants.pkl` (which
// would make torch.load hand the archive to torch.jit.load). A container without the source's
// record list (not made by `zckpt convert`) gets the records torch.save writes.
// Throws Error: kUnsafe (a refused global), kCorrupt (damaged, inconsistent or unsafe
// container, naming the file and what is wrong), kInvalidArgument (nothing to export),
// kUnsupported, kIo.
void ExportFile(const std::string& source, const std::string& destination, const ExportOptions& options = {});
inline void ExportFile(const std::string& source, const std::string& destination, ExportFormat format) {
  ExportOptions options;
  options.format = format;
  ExportFile(source, destination, options);
}

}  // namespace zckpt
