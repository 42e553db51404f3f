// `zckpt verify PATH...`: every checksum and structural rule of each container, every container
// below a folder, and a torch.distributed.checkpoint folder as a whole.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "cli.h"
#include "commands.h"
#include "common/open_file.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/source_kind.h"
#include "json_writer.h"
#include "printable.h"
#include "progress.h"
#include "zckpt/container.h"
#include "zckpt/dcp.h"
#include "zckpt/format.h"

namespace zckpt::cli {

namespace {

constexpr const char* kHelp =
    "usage: zckpt verify [--threads N] [--quiet] [--json] [--progress WHEN] PATH...\n\n"
    "Checks every byte of each container: superblock, footer and index checksums, every\n"
    "structural rule of format-spec/zckpt-v1.md, every chunk's XXH3 (zstd chunks are also\n"
    "decoded and their raw XXH3 checked), every blob, and that all padding is zero. Then that\n"
    "the kept object pickle (what zckpt.load and an exported .pt read) is readable, names no\n"
    "global that could run code, and describes the same storages and tensor views as the\n"
    "index (what Load/LoadInto/Map read).\n"
    "Every bad chunk is reported with its file, storage key, tensors and byte range.\n"
    "A PATH that is a folder stands for every container below it (files starting with the\n"
    "container magic, whatever their name); one line per container, then a summary line.\n"
    "A torch.distributed.checkpoint folder (.metadata beside .distcp shards or __R_N.zckpt\n"
    "containers), as PATH or below it, is checked as one checkpoint on one line: .metadata reads\n"
    "without running anything, every piece it lists is where it says with its dtype and shape,\n"
    "every non-tensor item is a torch.save archive naming no code-running global, and every\n"
    "container of the folder verifies in full (.distcp files carry no checksums to check).\n\n"
    "options:\n"
    "  -j, --threads N        checking threads per file (default: all cores)\n"
    "  -q, --quiet            print only the containers that are not OK (and the summary)\n"
    "  --json                 one JSON array, an object per container (and per DCP folder,\n"
    "                         with \"kind\": \"dcp\")\n";
constexpr const char* kHelpTail =
    "\nExit codes:\n"
    "  0  every container is good\n"
    "  1  at least one container (or DCP folder) is corrupt, its pickle and index disagree, or it\n"
    "     is refused as unsafe\n"
    "  2  at least one could not be checked (missing, unreadable, not a container, unsupported\n"
    "     version), a folder holding no container, or bad usage (2 wins over 1)\n";

struct FileResult {
  std::string path;
  int code = kExitOk;
  std::vector<std::string> problems;
  uint64_t bytes = 0;
  double seconds = 0;
  std::string dcp;  // a DCP folder: what was checked, for its OK line
};

FileResult VerifyOne(const std::string& path, unsigned threads, ProgressStyle progress) {
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
    for (std::string& p : checkpoint::ObjectPickleProblems(*c)) r.problems.push_back(std::move(p));
    r.code = r.problems.empty() ? kExitOk : kExitBad;
  } catch (const Error& e) {
    r.problems.push_back(checkpoint::WithNotAContainerHint(e, path).what());
    r.code = ExitCodeFor(e);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

FileResult VerifyDcp(const std::string& dir, unsigned threads, ProgressStyle progress) {
  FileResult r;
  r.path = dir;
  auto t0 = std::chrono::steady_clock::now();
  try {
    ProgressBar bar("verify " + dir, 0, progress);
    VerifyOptions opt;
    opt.threads = threads;
    opt.progress = [&bar](uint64_t done, uint64_t total) {
      bar.SetTotal(total);
      bar.Set(done);
    };
    DcpVerifyReport report = VerifyDcpFolder(dir, opt);
    bar.Finish();
    r.problems = report.problems;
    r.code = report.ok() ? kExitOk : kExitBad;
    r.bytes = report.bytes_checked;
    r.dcp = "DCP checkpoint: " + std::to_string(report.tensors) + " tensor pieces, " + std::to_string(report.bytes_items) +
            " other items, " + std::to_string(report.containers) + " containers verified, " +
            FormatBytes(report.bytes_checked) + " checked";
    if (report.distcp_pieces)
      r.dcp += "; " + std::to_string(report.distcp_pieces) + " pieces in .distcp files have no checksums: 'zckpt convert' the folder";
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.code = ExitCodeFor(e);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool HasContainerMagic(const std::filesystem::path& path) {
  struct stat st;
  FileDescriptor fd;
  try {
    fd = OpenRegularFile(path.string(), &st);  // a FIFO or device node in the folder is not opened
  } catch (const Error&) {
    return false;
  }
  uint8_t head[sizeof format::kSuperblockMagic];
  return ::read(fd.get(), head, sizeof head) == static_cast<ssize_t>(sizeof head) &&
         std::memcmp(head, format::kSuperblockMagic, sizeof head) == 0;
}

// What a PATH stands for: itself, or for a folder every container below it, sorted, a DCP folder
// (PATH itself or one below it) standing for its own files as one entry. A folder that cannot be
// walked, or holds nothing to check, is an error entry (an empty `files`).
struct Target {
  std::string path;
  std::vector<std::pair<std::string, bool>> files;  // (path, is a DCP folder)
  std::string error;
};

Target Expand(const std::string& path) {
  namespace fs = std::filesystem;
  Target t{path, {}, ""};
  std::error_code ec;
  if (!fs::is_directory(path, ec) || checkpoint::IsDcpFolder(path)) {
    t.files.emplace_back(path, checkpoint::IsDcpFolder(path));
    return t;
  }
  fs::recursive_directory_iterator it(path, fs::directory_options::none, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find(".zckpt-tmp-") != std::string::npos) continue;  // a writer's temporary, live or stale
    if (it->is_directory(ec) && !it->is_symlink(ec) && checkpoint::IsDcpFolder(it->path().string())) {
      t.files.emplace_back(it->path().string(), true);
      it.disable_recursion_pending();
    } else if (it->is_regular_file(ec) && HasContainerMagic(it->path())) {
      t.files.emplace_back(it->path().string(), false);
    }
  }
  if (ec) t.error = path + ": cannot walk the folder: " + ec.message();
  else if (t.files.empty()) t.error = path + ": no zckpt container below this folder (nor a DCP checkpoint)";
  std::sort(t.files.begin(), t.files.end());
  return t;
}

}  // namespace

int RunVerify(const Argv& argv) {
  Args args(argv, {"help", "quiet", "json"}, {"threads", "progress"}, {{"h", "help"}, {"q", "quiet"}, {"j", "threads"}});
  if (!args.ok()) return UsageError("verify", args.error());
  if (args.Has("help")) {
    std::fputs(kHelp, stdout);
    std::fputs(kProgressHelp, stdout);
    std::fputs(kHelpTail, stdout);
    return kExitOk;
  }
  auto style = ChooseProgressStyle(args.Get("progress"));
  if (!style) return UsageError("verify", "--progress takes auto, always or never");
  auto threads = args.GetInt("threads");
  if (!args.ok()) return UsageError("verify", args.error());
  if (threads && *threads < 0) return UsageError("verify", "--threads must be >= 0");
  if (args.positional().empty()) return UsageError("verify", "no PATH given");

  bool json = args.Has("json"), quiet = args.Has("quiet");
  ProgressStyle progress = json ? ProgressStyle::kNone : *style;
  int worst = kExitOk;
  bool any_folder = false;
  size_t counts[3] = {0, 0, 0}, checked = 0;  // ok, corrupt, error
  JsonWriter jw;
  jw.BeginArray();
  // Each result is printed as soon as it is known (a folder of 30 GiB shards takes a while).
  auto report = [&](const FileResult& r) {
    const std::string& path = r.path;
    ++checked;
    counts[r.code == kExitOk ? 0 : r.code == kExitBad ? 1 : 2]++;
    if (r.code == kExitCannotRun || worst == kExitCannotRun) worst = kExitCannotRun;
    else if (r.code == kExitBad) worst = kExitBad;
    if (json) {
      jw.BeginObject().Key("file").String(path);
      if (!r.dcp.empty()) jw.Key("kind").String("dcp");
      jw.Key("status")
          .String(r.code == kExitOk ? "ok" : r.code == kExitBad ? "corrupt" : "error");
      jw.Key("bytes").UInt(r.bytes).Key("seconds").Double(r.seconds);
      jw.Key("problems").BeginArray();
      for (const auto& p : r.problems) jw.String(p);
      jw.EndArray().EndObject();
      return;
    }
    if (r.code == kExitOk) {
      if (!quiet && !r.dcp.empty()) {
        std::printf("%s: OK (%s, %.3f s)\n", path.c_str(), r.dcp.c_str(), r.seconds);
      } else if (!quiet) {
        double gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0;
        std::printf("%s: OK (%s in %.3f s, %.2f GB/s)\n", Printable(path).c_str(), FormatBytes(r.bytes).c_str(),
                    r.seconds, gbps);
      }
    } else {
      const char* what = r.code == kExitBad ? "CORRUPT" : "ERROR";
      std::printf("%s: %s\n", Printable(path).c_str(), what);
      std::fflush(stdout);
      // One line per problem: a name in a message cannot start a line of its own.
      for (const auto& p : r.problems) std::fprintf(stderr, "  %s\n", Printable(p).c_str());
    }
    std::fflush(stdout);
  };
  for (const auto& arg : args.positional()) {
    Target target = Expand(arg);
    any_folder |= target.files.size() != 1 || target.files[0].first != arg;
    if (!target.error.empty()) {
      FileResult r;
      r.path = arg;
      r.code = kExitCannotRun;
      r.problems.push_back(target.error);
      report(r);
    }
    const unsigned n = threads ? static_cast<unsigned>(*threads) : 0;
    for (const auto& [path, dcp] : target.files) report(dcp ? VerifyDcp(path, n, progress) : VerifyOne(path, n, progress));
  }
  jw.EndArray();
  if (json) std::printf("%s\n", jw.str().c_str());
  else if (any_folder || checked > 1)
    std::printf("verify: %zu checked: %zu OK, %zu CORRUPT, %zu ERROR\n", checked, counts[0], counts[1], counts[2]);
  return worst;
}

}  // namespace zckpt::cli
