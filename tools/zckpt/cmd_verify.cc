// `zckpt verify FILE...`: every checksum and structural rule of each container.
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli.h"
#include "commands.h"
#include "json_writer.h"
#include "progress.h"
#include "zckpt/container.h"

namespace zckpt::cli {

namespace {

constexpr const char* kHelp =
    "usage: zckpt verify [--threads N] [--quiet] [--json] FILE...\n\n"
    "Checks every byte of each container: superblock, footer and index checksums, every\n"
    "structural rule of format-spec/zckpt-v1.md, every chunk's XXH3 (zstd chunks are also\n"
    "decoded and their raw XXH3 checked), every blob, and that all padding is zero.\n"
    "Every bad chunk is reported with its file, storage key, tensors and byte range.\n\n"
    "Exit codes: 0 every file is good; 1 at least one file is corrupt; 2 at least one file\n"
    "could not be checked (missing, unreadable, not a container, unsupported version) or\n"
    "bad usage (2 wins over 1).\n";

struct FileResult {
  std::string path;
  int code = kExitOk;
  std::vector<std::string> problems;
  uint64_t bytes = 0;
  double seconds = 0;
};

FileResult VerifyOne(const std::string& path, unsigned threads, bool progress) {
  FileResult r;
  r.path = path;
  auto t0 = std::chrono::steady_clock::now();
  try {
    auto c = Container::Open(path);
    r.bytes = c->file_bytes();
    ProgressBar bar("verify " + path, c->file_bytes(), progress);
    VerifyOptions opt;
    opt.threads = threads;
    opt.progress = [&bar](uint64_t done, uint64_t) { bar.Set(done); };
    VerifyReport report = c->Verify(opt);
    bar.Finish();
    for (const auto& p : report.problems) r.problems.push_back(p.message);
    r.code = report.ok() ? kExitOk : kExitBad;
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.code = ExitCodeFor(e);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

int RunVerify(const Argv& argv) {
  Args args(argv, {"help", "quiet", "json"}, {"threads"}, {{"h", "help"}, {"q", "quiet"}, {"j", "threads"}});
  if (!args.ok()) return UsageError("verify", args.error());
  if (args.Has("help")) {
    std::fputs(kHelp, stdout);
    return kExitOk;
  }
  auto threads = args.GetInt("threads");
  if (!args.ok()) return UsageError("verify", args.error());
  if (threads && *threads < 0) return UsageError("verify", "--threads must be >= 0");
  if (args.positional().empty()) return UsageError("verify", "no FILE given");

  bool json = args.Has("json"), quiet = args.Has("quiet");
  bool progress = !json && ProgressBar::DefaultEnabled();
  int worst = kExitOk;
  JsonWriter jw;
  jw.BeginArray();
  for (const auto& path : args.positional()) {
    FileResult r = VerifyOne(path, threads ? static_cast<unsigned>(*threads) : 0, progress);
    if (r.code == kExitCannotRun || worst == kExitCannotRun) worst = kExitCannotRun;
    else if (r.code == kExitBad) worst = kExitBad;
    if (json) {
      jw.BeginObject().Key("file").String(path).Key("status")
          .String(r.code == kExitOk ? "ok" : r.code == kExitBad ? "corrupt" : "error");
      jw.Key("bytes").UInt(r.bytes).Key("seconds").Double(r.seconds);
      jw.Key("problems").BeginArray();
      for (const auto& p : r.problems) jw.String(p);
      jw.EndArray().EndObject();
      continue;
    }
    if (r.code == kExitOk) {
      if (!quiet) {
        double gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0;
        std::printf("%s: OK (%s in %.3f s, %.2f GB/s)\n", path.c_str(), FormatBytes(r.bytes).c_str(), r.seconds, gbps);
      }
    } else {
      const char* what = r.code == kExitBad ? "CORRUPT" : "ERROR";
      std::printf("%s: %s\n", path.c_str(), what);
      for (const auto& p : r.problems) std::fprintf(stderr, "  %s\n", p.c_str());
    }
  }
  jw.EndArray();
  if (json) std::printf("%s\n", jw.str().c_str());
  return worst;
}

}  // namespace zckpt::cli
