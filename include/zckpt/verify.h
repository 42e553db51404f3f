// Verifying a checkpoint completely, whatever its shape: one entry for `zckpt verify`,
// `zckpt.verify` and any C++ caller.
//
// A path is a container, a torch.distributed.checkpoint folder (format-spec/folders.md), or a
// folder holding either below it. For each container: Container::Verify (every checksum and
// structural rule of format-spec/zckpt-v1.md, all padding zero), then the kept object pickle
// (readable, naming no code-running global, describing the same storages and tensor views as
// the index). A DCP folder is checked as one checkpoint: `.metadata`, every piece it lists, every
// BytesIO item, every container of the folder in full. Problems are collected, never thrown.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt {

enum class VerifyStatus {
  kOk,       // every check passed
  kCorrupt,  // every problem a finding (IsFinding): damaged, forged, or refused as unsafe (exit 1)
  kError,    // a problem that is not: missing, unreadable, not a container, unsupported (exit 2)
};

// What was found about one container or one DCP folder.
struct VerifiedFile {
  std::string path;
  bool dcp = false;  // a DCP folder checked as one checkpoint
  VerifyStatus status = VerifyStatus::kOk;
  // When an Error stopped the check of this file: its kind (it is the last problem).
  std::optional<ErrorKind> error;
  // Empty when OK. Each has its kind and place (file, storage, tensors, chunk, byte ranges, as
  // the message says them): a finding (IsFinding) of a check, or what kept a check from running
  // (status kError), as the Error that stopped it (VerifyProblem::Of).
  std::vector<VerifyProblem> problems;
  uint64_t bytes = 0;                 // bytes checked (a container: its size)
  double seconds = 0;
  // A DCP folder: what was checked.
  uint64_t containers = 0;     // containers verified in full
  uint64_t distcp_pieces = 0;  // pieces in FileSystemWriter .distcp files (no checksums to check)
  uint64_t tensors = 0, bytes_items = 0;
  bool ok() const { return status == VerifyStatus::kOk; }
};

struct VerifyPathOptions {
  std::optional<unsigned> threads;  // checking threads per file, as VerifyOptions::threads
  // A file's check starts (a container once it opened); `total` its bytes, 0 while unknown.
  std::function<void(const std::string& path, uint64_t total)> on_begin;
  // Bytes checked of the file begun last (done, total); calls never overlap.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Each file's result as soon as it is known (a folder of large shards takes a while).
  std::function<void(const VerifiedFile&)> on_file;
};

// Verifies `path` and every container (and DCP folder) below it when it is a folder, sorted by
// path. A folder that cannot be walked or holds nothing to check gives one entry for `path`
// itself with status kError. Never throws for what it finds (bad files are entries). `path` may be
// an object (s3://BUCKET/KEY) or an object folder (s3://BUCKET/PREFIX/: every object under it,
// as a local folder's files; zckpt/object_store.h).
std::vector<VerifiedFile> VerifyPath(const std::string& path, const VerifyPathOptions& options = {});

}  // namespace zckpt
