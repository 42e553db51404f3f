// `zckpt merge CKPT_DIR -o OUT`: full tensors from a sharded checkpoint (include/zckpt/merge.h).
#include <chrono>
#include <cstdio>

#include "cli.h"
#include "commands.h"
#include "progress.h"
#include "zckpt/merge.h"

namespace zckpt::cli {

namespace {

constexpr const char* kHelp =
    "usage: zckpt merge CKPT_DIR -o OUT [options]\n\n"
    "Reassembles the full tensors of a sharded checkpoint, without Python or torch:\n"
    "  - verl's per-rank files in CKPT_DIR (model_world_size_W_rank_R.zckpt, or .pt), FSDP1\n"
    "    ShardedTensor or FSDP2 DTensor shards, placed by the shards' own metadata;\n"
    "  - a torch.distributed.checkpoint folder (.metadata), written by zckpt's storage writer,\n"
    "    converted by 'zckpt convert', or DCP's own FileSystemWriter layout (.distcp).\n"
    "OUT ending in .zckpt: one container of the full tensors by name (zckpt.load gives the\n"
    "{name: tensor} dict, 'zckpt export' a .pt). Otherwise OUT is a Hugging Face folder:\n"
    "model.safetensors, or model-0000K-of-0000N.safetensors shards with\n"
    "model.safetensors.index.json, plus the config files of CKPT_DIR/huggingface/.\n"
    "CKPT_DIR, OUT and --hf-config may be folders in S3-compatible storage (s3://BUCKET/PREFIX/,\n"
    "configured as the AWS CLI is): .zckpt rank files and DCP folders of containers are read by\n"
    "ranged GETs; .pt or .distcp files there are refused (download them, or 'zckpt convert' the\n"
    "folder and upload that); each output object appears only whole (a multipart upload).\n\n"
    "Every tensor's pieces must tile it exactly before anything is written; pieces saved more\n"
    "than once (replicas) must hold the same bytes. Refused otherwise, naming files and tensor;\n"
    "every chunk read from a container is checked. Host memory: the largest tensor plus a chunk.\n\n"
    "options:\n"
    "  -o, --output OUT         a .zckpt file or a folder\n"
    "  --files NAME             verl layout: merge the NAME_world_size_* files (default: model).\n"
    "                           FSDP1's optim files (each rank's FlatParameter shards) are placed\n"
    "                           by the model files beside them and give each parameter's state as\n"
    "                           FSDP's full_optim_state_dict does (state.FQN.exp_avg, ...)\n"
    "  --keys PREFIX            keep only tensors named PREFIX..., without the prefix\n"
    "                           (a DCP save of {\"model\": ..., \"optim\": ...}: --keys model.)\n"
    "  --hf-config DIR          Hugging Face output: copy DIR's config files (config.json,\n"
    "                           tokenizer, ...; not its weights) beside the weights, in place of\n"
    "                           CKPT_DIR/huggingface/ (a DCP folder has none of its own)\n"
    "  --max-shard-size N       bytes per safetensors file (default 5G)\n"
    "  --chunk-bytes N, --zstd LEVEL   container output options, as for convert\n"
    "  -f, --force              overwrite outputs that exist (default: refuse, exit 2, before\n"
    "                           anything is written)\n"
    "  -q, --quiet              no summary\n"
    "%s";
constexpr const char* kHelpTail =
    "\nExit codes:\n"
    "  0  merged\n"
    "  1  a file is corrupt or refused as unsafe, or the shards do not fit together\n"
    "  2  could not run: bad usage, no checkpoint found, ranks missing, an output that exists\n"
    "     (without --force), a placement or dtype the output cannot hold, an I/O error\n";

}  // namespace

int RunMerge(const Argv& argv) {
  Args args(argv, {"help", "quiet", "force"},
            {"output", "files", "keys", "hf-config", "max-shard-size", "chunk-bytes", "zstd", "progress", "allow-global"},
            {{"h", "help"}, {"o", "output"}, {"q", "quiet"}, {"f", "force"}});
  if (!args.ok()) return UsageError("merge", args.error());
  if (args.Has("help")) {
    std::printf(kHelp, kAllowGlobalHelp);
    std::fputs(kProgressHelp, stdout);
    std::fputs(kHelpTail, stdout);
    return kExitOk;
  }
  auto progress = ChooseProgressStyle(args.Get("progress"));
  if (!progress) return UsageError("merge", "--progress takes auto, always or never");
  MergeOptions options;
  if (auto v = args.Get("files")) options.files = *v;
  if (auto v = args.Get("keys")) options.keys = *v;
  if (auto v = args.Get("hf-config")) options.huggingface_dir = *v;
  if (auto v = args.GetSize("max-shard-size")) options.max_shard_bytes = *v;
  if (auto v = args.GetSize("chunk-bytes")) options.writer.chunk_bytes = *v;
  if (auto v = args.GetInt("zstd")) options.writer.zstd_level = static_cast<int>(*v);
  if (!args.ok()) return UsageError("merge", args.error());
  if (options.max_shard_bytes == 0) return UsageError("merge", "--max-shard-size must be > 0");
  if (options.writer.zstd_level < 0 || options.writer.zstd_level > 22) return UsageError("merge", "--zstd takes 0..22");
  if (args.positional().size() != 1) return UsageError("merge", "expected exactly one CKPT_DIR");
  auto out = args.Get("output");
  if (!out) return UsageError("merge", "-o OUT is required");
  const std::string dir = args.positional()[0];
  if (SameFile(dir, *out)) return UsageError("merge", "the output is the checkpoint folder itself");
  options.overwrite = args.Has("force");
  options.allow_globals = args.GetAll("allow-global");
  ProgressBar bar("merge " + dir, 0, *progress);
  options.progress = [&bar](uint64_t done, uint64_t total) {
    bar.SetTotal(total);
    bar.Set(done);
  };
  auto t0 = std::chrono::steady_clock::now();
  MergeStats s = MergeCheckpoint(dir, *out, options);
  bar.Finish();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!args.Has("quiet")) {
    std::printf("%s -> %s: %s, %llu tensors from %llu pieces, %s (largest tensor %s), %.2f s\n", dir.c_str(),
                out->c_str(), s.layout.c_str(), static_cast<unsigned long long>(s.tensors),
                static_cast<unsigned long long>(s.pieces), FormatBytes(s.bytes).c_str(),
                FormatBytes(s.largest_tensor).c_str(), secs);
    for (const auto& f : s.written) std::printf("  wrote %s\n", f.c_str());
    if (!s.config_copied && out->size() > 6 && out->compare(out->size() - 6, 6, ".zckpt") != 0)
      std::printf("  no config.json: %s has no huggingface/ folder (--hf-config DIR names one)\n", dir.c_str());
  }
  return kExitOk;
}

}  // namespace zckpt::cli
