// Reassembling full tensors from sharded checkpoints, without Python or torch: verl's per-rank
// files (`model_world_size_W_rank_R.zckpt` or `.pt`, FSDP1 ShardedTensor or FSDP2 DTensor shards)
// and torch.distributed.checkpoint folders (zckpt's or FileSystemWriter's layout). Each full
// tensor is assembled in one host buffer from the pieces that tile it (every chunk checked on the
// way when the pieces are in containers) and written out before the next one is started: host
// memory is the largest tensor plus a chunk, not the model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zckpt/container_writer.h"

namespace zckpt {

struct MergeOptions {
  // verl layout: the file family `<files>_world_size_W_rank_R` to merge ("model", "optim").
  std::string files = "model";
  // Keep only tensors whose name starts with this, and drop it from the name (a DCP folder saved
  // as {"model": ..., "optim": ...} gives `--keys model.` the model's own names).
  std::string keys;
  // Hugging Face output: the most bytes of tensors in one safetensors file (a larger tensor gets
  // a file of its own).
  uint64_t max_shard_bytes = 5ull << 30;
  // Hugging Face output: the folder whose config files are copied beside the weights ("": the
  // checkpoint's own huggingface/ folder, when it has one). Its weights are never copied.
  std::string huggingface_dir;
  WriterOptions writer;  // container output
  // Globals ("module.name") a rank file's pickle may name besides zckpt's allowlist (a class of
  // your own); globals that could run code stay refused.
  std::vector<std::string> allow_globals;
  // When false, a file the merge would write that exists already is Error(kInvalidArgument),
  // raised after the checkpoint is read and before anything is written.
  bool overwrite = true;
  // (bytes assembled, total bytes) after each tensor.
  std::function<void(uint64_t, uint64_t)> progress;
};

struct MergeStats {
  std::string layout;           // "verl (8 ranks)", "DCP (zckpt)", "DCP (FileSystemWriter)"
  uint64_t tensors = 0;
  uint64_t pieces = 0;          // pieces read (replicas of one piece counted once)
  uint64_t bytes = 0;           // bytes of the full tensors
  uint64_t largest_tensor = 0;  // the biggest host buffer the merge held
  std::vector<std::string> written;  // files written
  bool config_copied = false;        // Hugging Face output: a config.json was copied beside the weights
};

// Merges the checkpoint in `dir` into `out`: a container when `out` ends in `.zckpt` (tensors by
// name, plus an object pickle so zckpt.load and `zckpt export` give the {name: tensor} dict),
// otherwise a Hugging Face folder (`model.safetensors`, or `model-0000K-of-0000N.safetensors`
// shards with `model.safetensors.index.json`; the files of `dir/huggingface/` copied beside).
// Before a byte is written, every tensor's pieces must tile it exactly (no gap, no overlap other
// than identical replicas) with one dtype. Throws Error: kCorrupt (a bad chunk, pieces that do
// not tile, metadata that disagrees with the files, a container whose pickle and index
// disagree), kUnsafe (a pickle naming a refused global), kUnsupported (Partial or _StridedShard
// placements, quantized tensors, a DTensor mesh other than ranks 0..W-1 in order, dtypes
// safetensors lacks), kInvalidArgument (no checkpoint found, ranks missing), kIo. `dir` and `out`
// may be object folders (s3://BUCKET/PREFIX/, zckpt/object_store.h): each output object appears
// whole or not at all; `.pt` and `.distcp` files in object storage are kUnsupported, naming them.
MergeStats MergeCheckpoint(const std::string& dir, const std::string& out, const MergeOptions& options = {});

// The pieces of every tensor of the DCP folder `dir` (.metadata) checked to tile it, as
// MergeCheckpoint checks them, reading no tensor bytes: Error(kCorrupt) naming the tensor and the
// chunks when they leave a gap or overlap other than as one box (`zckpt export` of a DCP folder).
void CheckDcpTiling(const std::string& dir);

// verl's FSDP1 optimizer files (`<options.files>_world_size_W_rank_R`: optimizer.state_dict() of
// FlatParameters, each rank's shard a plain 1-D tensor) are merged per parameter, as FSDP's
// full_optim_state_dict gives them (`state.<fqn>.<key>`), from the FlatParameter layout that the
// model files beside them and FSDP's flattening rules give (src/merge/fsdp1_flat.h). That layout,
// as JSON: {"world_size": W, "wrapped": "model.layers" or "", "flat_params": [{"unit", "numel",
// "shard", "flat_keys", "scalar_keys", "params": [{"fqn", "shape", "offset", "numel"}]}]};
// "" when the files are not such state. Errors as MergeCheckpoint's (kUnsupported when the
// files do not say where each parameter's moments lie).
std::string Fsdp1OptimLayout(const std::string& dir, const MergeOptions& options);

}  // namespace zckpt
