// `zckpt convert SRC [-o DST.zckpt]` and `zckpt convert DIR -o OUTDIR [-j N]`.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "printable.h"
#include "progress.h"
#include "zckpt/convert.h"
#include "zckpt/convert_folder.h"
#include "zckpt/dcp.h"
#include "zckpt/object_store.h"

namespace zckpt::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kHelpHead =
    "usage: zckpt convert SRC [-o DST.zckpt] [options]\n"
    "       zckpt convert DIR -o OUTDIR [-j N] [options]\n\n"
    "Rewrites torch.save files (zip or legacy format, torch 1.x/2.x) and safetensors files as\n"
    "zckpt containers without running Python: a torch pickle is read by a restricted interpreter\n"
    "that executes nothing. Its globals must be data: on zckpt's allowlist, or allowed with\n"
    "--allow-global; a global that could run code (os.system, eval, ...) is refused whatever is\n"
    "allowed. A safetensors header is checked offset by offset (lengths, JSON, dtype x\n"
    "shape, the data covered exactly). `zckpt.load` of a converted safetensors file returns the\n"
    "dict safetensors.torch.load_file does; `zckpt export --format safetensors` gives the file back.\n"
    "Without -o, DST is SRC with .pt/.pth/.bin/.safetensors replaced by .zckpt.\n\n"
    "With a folder (verl's global_step_N/actor/, a Hugging Face model folder), every checkpoint\n"
    "under it is converted to the same relative path under OUTDIR with the .zckpt extension; a\n"
    "sharded checkpoint's index (model.safetensors.index.json, pytorch_model.bin.index.json) is\n"
    "rewritten to name the converted shards; every other file (config.json, tokenizer files,\n"
    "...) is copied unchanged (--only-pt skips the copies). Files are converted N at a time (-j N).\n\n"
    "A torch.distributed.checkpoint folder (.metadata + *.distcp, FileSystemWriter's layout), as\n"
    "DIR or below it, is converted as one checkpoint: each .distcp file becomes a container of\n"
    "checksummed pieces that zckpt.dcp.ZckptStorageReader loads (at any world size) and\n"
    "'zckpt export' turns back into the same .distcp bytes; .metadata is read without running it.\n"
    "A .distcp or .metadata file given alone is named, not converted (its folder is the checkpoint).\n\n"
    "Checkpoints in formats zckpt does not convert are named, not copied as if they were plain\n"
    "files: a TorchScript archive, a GGUF file, a numpy .npz/.npy, a .distcp file outside a DCP\n"
    "folder. A folder holding any stops before writing anything (exit 2) unless --copy-unknown\n"
    "copies them unchanged.\n\n"
    "DST or OUTDIR may be in S3-compatible storage (s3://BUCKET/KEY.zckpt, s3://BUCKET/PREFIX/,\n"
    "configured as the AWS CLI is): each object is a multipart upload that appears only whole;\n"
    "an object that exists is a destination that exists (--force replaces it).\n\n"
    "options:\n"
    "  -o, --output PATH      destination file (or folder for a DIR source)\n"
    "  -f, --force            overwrite destinations that exist (default: refuse, exit 2)\n"
    "  -j, --jobs N           files converted at once in folder mode (default 1)\n"
    "  --chunk-bytes N        raw bytes per chunk, multiple of 4096 (default 4M)\n"
    "  --zstd LEVEL           compress chunks with zstd at LEVEL 1..22 (default 0: off;\n"
    "                         a chunk stays raw when compression does not pay)\n"
    "  --large-alignment N    alignment of large storages (default 4096)\n"
    "  --threads N            hashing/compression threads per file (default: all cores)\n"
    "  --only-pt              folder mode: do not copy non-checkpoint files\n"
    "  --copy-unknown         folder mode: copy checkpoints in other formats instead of stopping\n";
constexpr const char* kHelpTail =
    "  -q, --quiet            no per-file summary\n\n"
    "Nothing appears at a destination unless its conversion completes (temporary file, fsync,\n"
    "rename). Even with --force only a regular file is replaced: a FIFO, device node, directory\n"
    "or symbolic link at a destination is refused and left alone (exit 2; write to a link's\n"
    "target instead). A source that is not a regular file (a FIFO, a device) is refused, never\n"
    "read from. Storage locations such as cuda:0 are recorded, never acted on.\n\n"
    "Exit codes:\n"
    "  0  every file converted (or copied)\n"
    "  1  a source is corrupt or unsafe (malformed zip, pickle or safetensors header; a pickle\n"
    "     naming a code-running global; a DCP .metadata disagreeing with its .distcp files)\n"
    "  2  could not run: bad usage, a missing source, a destination that exists (without\n"
    "     --force), a file that is not a checkpoint zckpt converts (already a container or\n"
    "     zckpt's DCP layout, a lone .distcp file, TorchScript, GGUF, numpy; named in the\n"
    "     message), an empty folder, a destination file named as another format (-o y.pt),\n"
    "     an I/O error. 2 wins over 1.\n";

struct Job {
  std::string source, destination;
  FolderJob::Action action = FolderJob::Action::kConvert;
  std::string note;  // copied foreign checkpoints: their format
};

int RunJob(const Job& job, const FolderPlan* plan, const ConvertOptions& base, bool quiet, ProgressStyle progress) {
  if (job.action == FolderJob::Action::kConvertDcp) return ConvertDcp(job.source, job.destination, base, quiet, progress);
  try {
    if (job.action == FolderJob::Action::kRewriteIndex) {
      RewriteIndex(FolderJob{job.source, job.destination, job.action, "", ""}, *plan);
      if (!quiet) std::printf("%s -> %s (index rewritten to name the converted shards)\n", job.source.c_str(), job.destination.c_str());
      return kExitOk;
    }
    if (job.action != FolderJob::Action::kConvert) {
      CopyFile(job.source, job.destination);  // a source that shrinks: an error naming it
      if (!quiet) {
        if (job.note.empty()) std::printf("%s -> %s (copied)\n", job.source.c_str(), job.destination.c_str());
        else std::printf("%s -> %s (copied, not converted: %s)\n", job.source.c_str(), job.destination.c_str(), job.note.c_str());
      }
      return kExitOk;
    }
    ConvertOptions opt = base;
    ProgressBar bar("convert " + job.source, 0, progress);
    opt.progress = [&bar](uint64_t done, uint64_t total) {
      bar.SetTotal(total);
      bar.Set(done);
    };
    auto t0 = std::chrono::steady_clock::now();
    ConvertStats s = ConvertFile(job.source, job.destination, opt);
    bar.Finish();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!quiet) {
      std::printf("%s -> %s: %s %llu tensors, %llu storages, %s -> %s (%llu/%llu chunks zstd), %.2f s, %.2f GB/s\n",
                  job.source.c_str(), job.destination.c_str(), s.source_format.c_str(),
                  static_cast<unsigned long long>(s.tensors), static_cast<unsigned long long>(s.storages),
                  FormatBytes(s.source_bytes).c_str(), FormatBytes(s.written.file_bytes).c_str(),
                  static_cast<unsigned long long>(s.written.compressed_chunks),
                  static_cast<unsigned long long>(s.written.chunks), secs,
                  secs > 0 ? static_cast<double>(s.source_bytes) / secs / 1e9 : 0.0);
    }
    return kExitOk;
  } catch (const Error& e) {
    std::fprintf(stderr, "zckpt convert: %s\n", Printable(e.what(), true).c_str());
    return ExitCodeFor(e);
  }
}

int ConvertFolder(const std::string& src, const std::string& out, const Args& args, const ConvertOptions& opt, unsigned n,
                  ProgressStyle progress) {
  bool quiet = args.Has("quiet"), copy_unknown = args.Has("copy-unknown");
  FolderPlan plan = PlanFolder(src, out, args.Has("only-pt"));
  // Exit 0 with nothing written would read as success (verify of the same folder exits 2).
  if (plan.jobs.empty()) return UsageError("convert", src + ": an empty folder, nothing to convert; nothing was written");
  // Foreign checkpoints stop the run before anything is written, unless they are to be copied.
  std::vector<Job> jobs;
  std::vector<const FolderJob*> foreign;
  for (const FolderJob& f : plan.jobs) {
    if (f.action == FolderJob::Action::kForeign) foreign.push_back(&f);
    jobs.push_back({f.source, f.destination, f.action, f.kind});
  }
  if (!foreign.empty() && !copy_unknown) {
    for (const FolderJob* f : foreign) std::fprintf(stderr, "zckpt convert: %s: %s\n", f->source.c_str(), f->why.c_str());
    return UsageError("convert", std::to_string(foreign.size()) + " file" + (foreign.size() == 1 ? " is a checkpoint" : "s are checkpoints") +
                                     " in a format zckpt does not convert (above); nothing was written. --copy-unknown "
                                     "copies them unchanged and converts the rest");
  }
  // Two sources mapping to one destination (model.pt and model.bin -> model.zckpt) would lose one.
  std::map<std::string, std::string> by_destination;
  std::vector<std::string> existing;
  for (const Job& j : jobs) {
    const bool dcp = j.action == FolderJob::Action::kConvertDcp;
    if (SameFile(j.destination, j.source))
      return UsageError("convert", std::string("the destination is the source ") + (dcp ? "folder: " : "file: ") + j.source);
    // A DCP folder writes a container per .distcp file and copies the rest: each is a destination.
    std::vector<std::string> outputs = dcp
                                           ? DcpConvertOutputs(j.source, j.destination)
                                           : std::vector<std::string>{j.destination};
    for (const std::string& d : outputs) {
      auto [it, inserted] = by_destination.emplace(d, j.source);
      if (!inserted) return UsageError("convert", "both " + it->second + " and " + j.source + " would be written to " + d);
      if (!args.Has("force") && Exists(d)) existing.push_back(d);
    }
  }
  if (!existing.empty()) return RefuseExisting("convert", existing);
  std::error_code ec;
  if (!IsObjectUrl(out))  // an object folder (s3://BUCKET/PREFIX/) is only its keys' common prefix
    for (const Job& j : jobs) fs::create_directories(fs::path(j.destination).parent_path(), ec);
  if (n > 1 && progress == ProgressStyle::kBar) progress = ProgressStyle::kNone;  // bars of parallel jobs would interleave
  std::atomic<size_t> next{0};
  std::atomic<int> worst{kExitOk};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < n; ++t) {
    workers.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        int rc = RunJob(jobs[i], &plan, opt, quiet, progress);
        int prev = worst.load();
        while (rc > prev && !worst.compare_exchange_weak(prev, rc)) {
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  return worst.load();
}

}  // namespace

int RunConvert(const Argv& argv) {
  Args args(argv, {"help", "only-pt", "quiet", "force", "copy-unknown"},
            {"output", "jobs", "chunk-bytes", "zstd", "large-alignment", "threads", "progress", "allow-global"},
            {{"h", "help"}, {"o", "output"}, {"j", "jobs"}, {"q", "quiet"}, {"f", "force"}});
  if (!args.ok()) return UsageError("convert", args.error());
  if (args.Has("help")) {
    std::fputs(kHelpHead, stdout);
    std::fputs(kProgressHelp, stdout);
    std::fputs(kAllowGlobalHelp, stdout);
    std::fputs(kHelpTail, stdout);
    return kExitOk;
  }
  ConvertOptions opt;
  opt.allow_globals = args.GetAll("allow-global");
  if (auto v = args.GetSize("chunk-bytes")) opt.writer.chunk_bytes = *v;
  if (auto v = args.GetInt("zstd")) opt.writer.zstd_level = static_cast<int>(*v);
  if (auto v = args.GetSize("large-alignment")) opt.writer.large_alignment = static_cast<uint32_t>(*v);
  if (auto v = args.GetInt("threads")) opt.writer.threads = static_cast<unsigned>(*v);
  auto jobs_opt = args.GetInt("jobs");
  if (!args.ok()) return UsageError("convert", args.error());
  if (opt.writer.zstd_level < 0 || opt.writer.zstd_level > 22) return UsageError("convert", "--zstd takes 0..22");
  if (jobs_opt && *jobs_opt < 1) return UsageError("convert", "--jobs must be >= 1");
  if (jobs_opt && *jobs_opt > 1024) return UsageError("convert", "--jobs must be <= 1024");
  if (auto v = args.GetInt("threads"); v && (*v < 0 || *v > 1024))
    return UsageError("convert", "--threads takes 0..1024 (0: all cores)");
  auto progress = ChooseProgressStyle(args.Get("progress"));
  if (!progress) return UsageError("convert", "--progress takes auto, always or never");
  if (args.positional().size() != 1) return UsageError("convert", "expected exactly one SRC (file or folder)");
  const std::string src = args.positional()[0];
  if (IsObjectUrl(src))
    return UsageError("convert", src + ": convert reads local sources (a .pt or safetensors parser reads a local "
                                       "mapping): download it first; the destination (-o) may be s3://BUCKET/...");
  std::error_code ec;

  if (!fs::is_directory(src, ec)) {
    if (!fs::exists(src, ec)) {
      std::fprintf(stderr, "zckpt convert: no such file: %s\n", src.c_str());
      return kExitCannotRun;
    }
    Job job{src, args.Get("output").value_or(DefaultDestination(src)), FolderJob::Action::kConvert, ""};
    if (SameFile(job.destination, src)) return UsageError("convert", "the destination is the source file: " + src);
    if (!args.Has("force") && fs::is_directory(job.destination, ec))  // --force would not replace it either
      return UsageError("convert", job.destination + " is a folder: a file converts to a file (-o " +
                                       (fs::path(job.destination) / fs::path(DefaultDestination(src)).filename()).string() + ")");
    if (std::string why = MisleadingExtension(job.destination, ".zckpt", "a zckpt container"); !why.empty())
      return UsageError("convert", why);
    if (!args.Has("force") && Exists(job.destination)) return RefuseExisting("convert", {job.destination});
    return RunJob(job, nullptr, opt, args.Has("quiet"), *progress);
  }

  auto out = args.Get("output");
  if (!out) return UsageError("convert", "a folder source needs -o OUTDIR");
  return ConvertFolder(src, *out, args, opt, static_cast<unsigned>(jobs_opt.value_or(1)), *progress);
}

}  // namespace zckpt::cli
