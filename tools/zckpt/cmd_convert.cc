// `zckpt convert SRC.pt [-o DST.zckpt]` and `zckpt convert DIR -o OUTDIR [-j N]`.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "progress.h"
#include "zckpt/convert.h"

namespace zckpt::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kHelp =
    "usage: zckpt convert SRC.pt [-o DST.zckpt] [options]\n"
    "       zckpt convert DIR -o OUTDIR [-j N] [options]\n\n"
    "Rewrites torch.save files (zip or legacy format, torch 1.x/2.x) as .zckpt containers\n"
    "without running Python: the pickle is read by a restricted interpreter that executes\n"
    "nothing, and a file naming a global that could run code (os.system, eval, ...) is refused.\n"
    "Without -o, DST is SRC with .pt/.pth/.bin replaced by .zckpt.\n\n"
    "With a folder (e.g. verl's global_step_N/actor/), every .pt/.pth/.bin file under it is\n"
    "converted to the same relative path under OUTDIR with the .zckpt extension; every other\n"
    "file (fsdp_config.json, huggingface/ ...) is copied unchanged, so OUTDIR is a complete\n"
    "checkpoint folder (--only-pt skips the copies). Files are converted N at a time (-j N).\n\n"
    "options:\n"
    "  -o, --output PATH      destination file (or folder for a DIR source)\n"
    "  -j, --jobs N           files converted at once in folder mode (default 1)\n"
    "  --chunk-bytes N        raw bytes per chunk, multiple of 4096 (default 4M)\n"
    "  --zstd LEVEL           compress chunks with zstd at LEVEL 1..22 (default 0: off;\n"
    "                         a chunk stays raw when compression does not pay)\n"
    "  --large-alignment N    alignment of large storages (default 4096)\n"
    "  --threads N            hashing/compression threads per file (default: all cores)\n"
    "  --only-pt              folder mode: do not copy non-checkpoint files\n"
    "  --quiet                no per-file summary\n\n"
    "Nothing appears at a destination unless its conversion completes (temporary file, fsync,\n"
    "rename). Storage locations such as cuda:0 are recorded, never acted on.\n"
    "Exit codes: 0 converted; 1 a source is corrupt or unsafe; 2 could not run.\n";

struct Job {
  std::string source, destination;
  bool convert = true;  // false: copy unchanged
};

void CopyFile(const std::string& from, const std::string& to) {
  MappedFile in(from);
  AtomicFile out(to);
  if (in.size()) out.Write(in.data(), in.size());
  out.Commit();
}

int ConvertOne(const Job& job, const ConvertOptions& base, bool quiet, bool progress) {
  try {
    if (!job.convert) {
      CopyFile(job.source, job.destination);
      if (!quiet) std::printf("%s -> %s (copied)\n", job.source.c_str(), job.destination.c_str());
      return kExitOk;
    }
    ConvertOptions opt = base;
    struct stat st;
    uint64_t total = ::stat(job.source.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    ProgressBar bar("convert " + job.source, total, progress);
    opt.progress = [&bar](uint64_t done, uint64_t) { bar.Set(done); };
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
    std::fprintf(stderr, "zckpt convert: %s\n", e.what());
    return ExitCodeFor(e);
  }
}

std::vector<Job> PlanFolder(const std::string& src, const std::string& out, bool only_pt) {
  std::vector<Job> jobs;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    fs::path rel = fs::relative(entry.path(), src);
    std::string name = rel.filename().string();
    if (name.find(".zckpt-tmp-") != std::string::npos) continue;  // a stale temp of ours
    Job job;
    job.source = entry.path().string();
    job.convert = IsCheckpointName(name);
    if (!job.convert && only_pt) continue;
    fs::path dst = fs::path(out) / rel;
    job.destination = job.convert ? DefaultDestination(dst.string()) : dst.string();
    jobs.push_back(job);
  }
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.source < b.source; });
  return jobs;
}

}  // namespace

int RunConvert(const Argv& argv) {
  Args args(argv, {"help", "only-pt", "quiet"},
            {"output", "jobs", "chunk-bytes", "zstd", "large-alignment", "threads"},
            {{"h", "help"}, {"o", "output"}, {"j", "jobs"}, {"q", "quiet"}});
  if (!args.ok()) return UsageError("convert", args.error());
  if (args.Has("help")) {
    std::fputs(kHelp, stdout);
    return kExitOk;
  }
  ConvertOptions opt;
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
  if (args.positional().size() != 1) return UsageError("convert", "expected exactly one SRC (file or folder)");
  const std::string src = args.positional()[0];
  bool quiet = args.Has("quiet");
  std::error_code ec;

  if (!fs::is_directory(src, ec)) {
    if (!fs::exists(src, ec)) {
      std::fprintf(stderr, "zckpt convert: no such file: %s\n", src.c_str());
      return kExitCannotRun;
    }
    Job job{src, args.Get("output").value_or(DefaultDestination(src)), true};
    if (SameFile(job.destination, src)) return UsageError("convert", "the destination is the source file: " + src);
    return ConvertOne(job, opt, quiet, ProgressBar::DefaultEnabled());
  }

  auto out = args.Get("output");
  if (!out) return UsageError("convert", "a folder source needs -o OUTDIR");
  std::vector<Job> jobs = PlanFolder(src, *out, args.Has("only-pt"));
  // Two sources mapping to one destination (model.pt and model.bin -> model.zckpt) would lose one.
  std::map<std::string, std::string> by_destination;
  for (const Job& j : jobs) {
    auto [it, inserted] = by_destination.emplace(j.destination, j.source);
    if (!inserted)
      return UsageError("convert", "both " + it->second + " and " + j.source + " would be written to " + j.destination);
  }
  for (const Job& j : jobs) fs::create_directories(fs::path(j.destination).parent_path(), ec);
  unsigned n = static_cast<unsigned>(jobs_opt.value_or(1));
  bool progress = n == 1 && ProgressBar::DefaultEnabled();
  std::atomic<size_t> next{0};
  std::atomic<int> worst{kExitOk};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < n; ++t) {
    workers.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        int rc = ConvertOne(jobs[i], opt, quiet, progress);
        int prev = worst.load();
        while (rc > prev && !worst.compare_exchange_weak(prev, rc)) {
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  return worst.load();
}

}  // namespace zckpt::cli
