// `.pt` <-> `.zckpt`: the converter and the exporter. No torch and no Python: the source's
// pickle is read by zckpt's restricted interpreter, which executes nothing and refuses globals
// that could run code (Error kUnsafe), and kept verbatim for the way back.
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
  // Called as storage bytes are written: (bytes done, bytes total) for the current file.
  std::function<void(uint64_t, uint64_t)> progress;
  const std::atomic<bool>* cancel = nullptr;
};

struct ConvertStats {
  std::string source_format;  // "zip" or "legacy"
  uint64_t source_bytes = 0;
  uint64_t storages = 0;
  uint64_t tensors = 0;
  WriterStats written;
};

// Converts one `.pt` file (zip or legacy format, torch 1.x or 2.x). Nothing appears at
// `destination` unless the whole conversion succeeds. Throws Error: kUnsafe (a code-running
// global, naming it and its pickle offset), kCorrupt (malformed source), kNotContainer (not a
// .pt), kUnsupported (TorchScript, big-endian, ...), kIo.
ConvertStats ConvertFile(const std::string& source, const std::string& destination, const ConvertOptions& options);

// The destination `zckpt convert SRC.pt` uses without -o: SRC with `.pt`/`.pth`/`.bin` replaced by
// `.zckpt` (appended when SRC has another extension).
std::string DefaultDestination(const std::string& source);

// True for names `zckpt convert DIR` treats as torch.save files (.pt, .pth, .bin).
bool IsTorchCheckpointName(const std::string& name);

// Writes the container back as the `.pt` it came from: the kept object pickle and every record
// of the source archive (zip), or the kept legacy header and the storages (legacy, then
// byte-identical to the source). torch.load reads it to an object equal to the original.
void ExportFile(const std::string& source, const std::string& destination);

}  // namespace zckpt
