// What `zckpt convert DIR -o OUTDIR` does with each file under DIR, decided before anything is
// written: convert it (torch.save and safetensors files; a torch.distributed.checkpoint folder of
// .distcp shards as a whole), rewrite it (a sharded checkpoint's index, to name the converted
// shards), copy it (config.json, tokenizer files, ...), or stop at it (a checkpoint in a format
// zckpt does not convert: TorchScript, GGUF, numpy, a stray .distcp file), unless --copy-unknown
// says to copy those too. `zckpt convert` runs the plan: ConvertFile, ConvertDcpFolder,
// RewriteIndex, CopyFile per job.
#pragma once

#include <string>
#include <vector>

namespace zckpt {

struct FolderJob {
  enum class Action {
    kConvert,
    kCopy,
    kRewriteIndex,  // model.safetensors.index.json, pytorch_model.bin.index.json
    kForeign,       // a checkpoint in another format: stops the run, or copied (--copy-unknown)
    kConvertDcp,    // a DCP folder (source and destination are folders: zckpt/dcp.h)
  };
  std::string source, destination;
  Action action = Action::kCopy;
  std::string why;   // kForeign: what the file is and what to use instead
  std::string kind;  // kForeign: its format, in a few words ("TorchScript archive")
};

struct FolderPlan {
  std::vector<FolderJob> jobs;  // sorted by source
};

// Walks `src` (symlinks to files followed, our own stale temporaries skipped). A DCP folder of
// .distcp shards (`src` itself or one below it) is one kConvertDcp job; one in zckpt's DCP layout
// below `src` is copied like any containers. `only_pt`: plain files are left out (indexes,
// foreign checkpoints and DCP folders are not plain files). Throws Error(kIo) when a file cannot
// be read.
FolderPlan PlanFolder(const std::string& src, const std::string& out, bool only_pt);

// The index at `job.source` with every shard this plan converts renamed to its container;
// written to `job.destination` through an atomic file. Throws Error (kCorrupt when it is not an
// index, kIo).
void RewriteIndex(const FolderJob& job, const FolderPlan& plan);

// Copies `source` to `destination` as a folder conversion copies: the destination appears only
// complete (temporary, fsync, rename); a source that shrinks while it is read is an Error(kIo)
// naming it.
void CopyFile(const std::string& source, const std::string& destination);

}  // namespace zckpt
