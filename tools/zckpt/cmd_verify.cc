// `zckpt verify PATH...`: every checksum and structural rule of each container, every container
// below a folder, and a torch.distributed.checkpoint folder as a whole.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "json_writer.h"
#include "printable.h"
#include "progress.h"
#include "zckpt/verify.h"

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
    "container of the folder verifies in full (.distcp files carry no checksums to check).\n"
    "PATH may be an object in S3-compatible storage (s3://BUCKET/KEY) or a folder there\n"
    "(s3://BUCKET/PREFIX/: every object under the prefix, as a local folder; a DCP folder of\n"
    "__R_N.zckpt containers too), configured as the AWS CLI is (AWS_ENDPOINT_URL, AWS_PROFILE, ...).\n\n"
    "options:\n"
    "  --threads N            checking threads per file (default, or 0: all cores)\n"
    "  -q, --quiet            print only the containers that are not OK (and the summary)\n"
    "  --json                 one JSON array, an object per container (and per DCP folder,\n"
    "                         with \"kind\": \"dcp\"); beside \"problems\" (messages),\n"
    "                         \"problem_places\": each one's kind, file, storage, tensors,\n"
    "                         chunk, file_bytes and storage_bytes (null when not about it)\n";
constexpr const char* kHelpTail =
    "\nExit codes:\n"
    "  0  every container is good\n"
    "  1  at least one container (or DCP folder) is corrupt, its pickle and index disagree, or it\n"
    "     is refused as unsafe\n"
    "  2  at least one could not be checked (missing, unreadable, not a container, unsupported\n"
    "     version), a folder holding no container, or bad usage (2 wins over 1)\n";

// A problem escaped for one line, but for the hint WithNotAContainerHint appends
// ("\n  hint: ..."), which goes on a line of its own, indented under it.
std::string WithHintLine(const std::string& p) {
  const size_t at = p.rfind("\n  hint: ");
  if (at == std::string::npos) return Printable(p);
  return Printable(p.substr(0, at)) + "\n    " + Printable(p.substr(at + 3));
}

// One problem's kind and place, as an object: "kind" (ErrorKindName), "file", "storage",
// "tensors", "chunk", "file_bytes", "storage_bytes" ([begin, end)); null when unset.
void WritePlace(JsonWriter& jw, const VerifyProblem& p) {
  const ErrorPlace& at = p.place;
  auto text = [&](const char* key, const std::string& v) {
    jw.Key(key);
    v.empty() ? jw.Null() : jw.String(v);
  };
  auto range = [&](const char* key, const std::optional<ByteRange>& v) {
    jw.Key(key);
    if (v) jw.BeginArray().UInt(v->begin).UInt(v->end).EndArray();
    else jw.Null();
  };
  jw.BeginObject().Key("kind").String(ErrorKindName(p.kind));
  text("file", at.file);
  text("storage", at.storage);
  jw.Key("tensors");
  if (at.tensors.empty()) jw.Null();
  else {
    jw.BeginArray();
    for (const std::string& t : at.tensors) jw.String(t);
    jw.EndArray();
  }
  jw.Key("chunk");
  at.chunk < 0 ? jw.Null() : jw.Int(at.chunk);
  range("file_bytes", at.file_bytes);
  range("storage_bytes", at.storage_bytes);
  jw.EndObject();
}

// The exit code of one file's result: its status, which IsFinding decided (zckpt/verify.h).
int ExitCodeOf(const VerifiedFile& r) {
  return r.status == VerifyStatus::kOk ? kExitOk : r.status == VerifyStatus::kCorrupt ? kExitBad : kExitCannotRun;
}

// What a DCP folder's OK line says was checked.
std::string DcpSummary(const VerifiedFile& r) {
  if (r.containers == 0)  // FileSystemWriter's layout: no byte of it carries a checksum
    return "DCP checkpoint of .distcp files: " + std::to_string(r.tensors) + " tensor pieces and " +
           std::to_string(r.bytes_items) + " other items are where .metadata says, with its dtypes and shapes; " +
           "their bytes could not be checked: .distcp files have no checksums ('zckpt convert' the folder to get them)";
  std::string s = "DCP checkpoint: " + std::to_string(r.tensors) + " tensor pieces, " + std::to_string(r.bytes_items) +
                  " other items, " + std::to_string(r.containers) + " containers verified, " + FormatBytes(r.bytes) +
                  " checked";
  if (r.distcp_pieces)
    s += "; " + std::to_string(r.distcp_pieces) + " pieces in .distcp files have no checksums: 'zckpt convert' the folder";
  return s;
}

}  // namespace

int RunVerify(const Argv& argv) {
  Args args(argv, {"help", "quiet", "json"}, {"threads", "j-threads", "progress"},
            {{"h", "help"}, {"q", "quiet"}, {"j", "j-threads"}});
  if (!args.ok()) return UsageError("verify", args.error());
  if (args.Has("help")) {
    std::fputs(kHelp, stdout);
    std::fputs(kProgressHelp, stdout);
    std::fputs(kHelpTail, stdout);
    return kExitOk;
  }
  auto style = ChooseProgressStyle(args.Get("progress"));
  if (!style) return UsageError("verify", "--progress takes auto, always or never");
  // -j, the former spelling of --threads here, is the number of files at once (--jobs) in convert.
  WarnDeprecated(args, "verify", "j-threads", "-j", "checking threads are --threads (-j is --jobs in convert)");
  auto threads = args.Has("threads") ? args.GetInt("threads") : args.GetInt("j-threads");
  if (!args.ok()) return UsageError("verify", args.error());
  if (threads && *threads < 0) return UsageError("verify", "--threads must be >= 0 (0: the default)");
  if (args.positional().empty()) return UsageError("verify", "no PATH given");

  bool json = args.Has("json"), quiet = args.Has("quiet");
  ProgressStyle progress = json ? ProgressStyle::kNone : *style;
  int worst = kExitOk;
  bool any_folder = false;
  size_t counts[3] = {0, 0, 0}, checked = 0;  // ok, corrupt, error
  JsonWriter jw;
  jw.BeginArray();
  // Each result is printed as soon as it is known (a folder of 30 GiB shards takes a while).
  auto report = [&](const VerifiedFile& r) {
    const std::string& path = r.path;
    const int code = ExitCodeOf(r);
    ++checked;
    counts[code == kExitOk ? 0 : code == kExitBad ? 1 : 2]++;
    if (code == kExitCannotRun || worst == kExitCannotRun) worst = kExitCannotRun;
    else if (code == kExitBad) worst = kExitBad;
    if (json) {
      jw.BeginObject().Key("file").String(path);
      if (r.dcp) jw.Key("kind").String("dcp");
      jw.Key("status")
          .String(code == kExitOk ? "ok" : code == kExitBad ? "corrupt" : "error");
      if (r.error) jw.Key("error").String(r.problems.back().message);  // what stopped the check (as ls and load)
      jw.Key("bytes").UInt(r.bytes).Key("seconds").Double(r.seconds);
      jw.Key("problems").BeginArray();
      for (const auto& p : r.problems) jw.String(p.message);
      jw.EndArray();
      jw.Key("problem_places").BeginArray();
      for (const auto& p : r.problems) WritePlace(jw, p);
      jw.EndArray().EndObject();
      return;
    }
    if (code == kExitOk) {
      if (!quiet && r.dcp) {
        std::printf("%s: OK (%s, %.3f s)\n", path.c_str(), DcpSummary(r).c_str(), r.seconds);
      } else if (!quiet) {
        double gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0;
        std::printf("%s: OK (%s in %.3f s, %.2f GB/s)\n", Printable(path).c_str(), FormatBytes(r.bytes).c_str(),
                    r.seconds, gbps);
      }
    } else {
      const char* what = code == kExitBad ? "CORRUPT" : "ERROR";
      std::printf("%s: %s\n", Printable(path).c_str(), what);
      std::fflush(stdout);
      // One line per problem (a name in a message cannot start a line of its own), and a
      // not-a-container hint on a line of its own under it.
      for (const auto& p : r.problems) std::fprintf(stderr, "  %s\n", WithHintLine(p.message).c_str());
    }
    std::fflush(stdout);
  };
  // One progress bar per file, from when its check starts; finished when the file is.
  std::unique_ptr<ProgressBar> bar;
  VerifyPathOptions options;
  if (threads) options.threads = static_cast<unsigned>(*threads);
  options.on_begin = [&](const std::string& path, uint64_t total) {
    bar = std::make_unique<ProgressBar>("verify " + path, total, progress);
  };
  options.progress = [&](uint64_t done, uint64_t total) {
    bar->SetTotal(total);
    bar->Set(done);
  };
  options.on_file = [&](const VerifiedFile& r) {
    if (bar && !r.error) bar->Finish();
    bar.reset();
    report(r);
  };
  for (const auto& arg : args.positional()) {
    std::vector<VerifiedFile> results = VerifyPath(arg, options);
    any_folder |= results.size() != 1 || results[0].path != arg;
  }
  jw.EndArray();
  if (json) std::printf("%s\n", jw.str().c_str());
  else if (any_folder || checked > 1)
    std::printf("verify: %zu checked: %zu OK, %zu CORRUPT, %zu ERROR\n", checked, counts[0], counts[1], counts[2]);
  return worst;
}

}  // namespace zckpt::cli
