// `zckpt bench verify FILE`: verify throughput against baselines measured in the same run.
//
// The machines this runs on are shared and noisy, so absolute GB/s mean little; what the
// report gives is ratios against a plain sequential read of the same file (`cat FILE >
// /dev/null`, done in-process with read(2) into a 1 MiB buffer) and against single-core XXH3 of
// the same bytes, each measured right next to the verify, best of N. All three run with the
// file in the page cache (a warm-up read first), so they compare like with like.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "common/mapped_file.h"
#include "common/open_file.h"
#include "json_writer.h"
#include "progress.h"
#include "zckpt/container.h"

namespace zckpt::cli {

namespace {

constexpr const char* kHelp =
    "usage: zckpt bench verify FILE [--repeat N] [--threads N] [--json]\n\n"
    "Times `zckpt verify` of FILE against, in the same run and with the file in the page\n"
    "cache: a sequential read of the file (what `cat FILE > /dev/null` does) and single-core\n"
    "XXH3 over the same bytes. Prints best-of-N seconds, GB/s and ratios.\n"
    "Load benchmarks (torch.load, safetensors, memcpy baselines): tools/bench/bench_load.py.\n"
    "Convert benchmark (against cp): tools/bench/bench_convert.py; safetensors convert and load\n"
    "(against load_file): tools/bench/bench_safetensors.py.\n\n"
    "Exit codes:\n"
    "  0  measured\n"
    "  1  the file is corrupt\n"
    "  2  could not run: bad usage, a missing file, not a container, an I/O error\n";

double BestOf(int repeat, const std::function<void()>& fn) {
  double best = 1e300;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void SequentialRead(const std::string& path) {
  struct stat st;
  FileDescriptor fd = OpenRegularFile(path, &st);  // a FIFO would block a plain open
  std::vector<char> buf(1 << 20);
  while (::read(fd.get(), buf.data(), buf.size()) > 0) {
  }
}

}  // namespace

int RunBench(const Argv& argv) {
  Args args(argv, {"help", "json"}, {"repeat", "threads"}, {{"h", "help"}});
  if (!args.ok()) return UsageError("bench", args.error());
  if (args.Has("help") || args.positional().empty()) {
    std::fputs(kHelp, args.Has("help") ? stdout : stderr);
    return args.Has("help") ? kExitOk : kExitCannotRun;
  }
  if (args.positional()[0] != "verify" || args.positional().size() != 2)
    return UsageError("bench", "expected: zckpt bench verify FILE");
  const std::string path = args.positional()[1];
  auto repeat = args.GetInt("repeat");
  auto threads = args.GetInt("threads");
  if (!args.ok()) return UsageError("bench", args.error());
  int n = static_cast<int>(repeat.value_or(3));
  if (n < 1) return UsageError("bench", "--repeat must be >= 1");

  auto container = Container::Open(path);
  const uint64_t bytes = container->file_bytes();
  MappedFile mapped(path);
  SequentialRead(path);  // warm the page cache for all three measurements

  double t_read = BestOf(n, [&] { SequentialRead(path); });
  volatile uint64_t sink = 0;
  double t_xxh3 = BestOf(n, [&] { sink = sink + format::Checksum(mapped.data(), mapped.size()); });
  VerifyOptions opt;
  opt.threads = threads ? static_cast<unsigned>(*threads) : 0;
  bool ok = true;
  double t_verify = BestOf(n, [&] { ok = container->Verify(opt).ok() && ok; });
  if (!ok) {
    std::fprintf(stderr, "zckpt bench: %s does not verify; run `zckpt verify` for details\n", path.c_str());
    return kExitBad;
  }

  auto gbps = [&](double s) { return static_cast<double>(bytes) / s / 1e9; };
  if (args.Has("json")) {
    JsonWriter j;
    j.BeginObject().Key("file").String(path).Key("bytes").UInt(bytes).Key("repeat").Int(n);
    j.Key("read_seconds").Double(t_read).Key("xxh3_1core_seconds").Double(t_xxh3).Key("verify_seconds").Double(t_verify);
    j.Key("verify_vs_read").Double(t_read / t_verify).Key("verify_vs_xxh3").Double(t_xxh3 / t_verify);
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("%s: %s, best of %d, page cache warm, %u hardware threads\n", path.c_str(),
                FormatBytes(bytes).c_str(), n, std::thread::hardware_concurrency());
    std::printf("  %-28s %8.3f s %7.2f GB/s\n", "sequential read (cat)", t_read, gbps(t_read));
    std::printf("  %-28s %8.3f s %7.2f GB/s\n", "XXH3, one core", t_xxh3, gbps(t_xxh3));
    std::printf("  %-28s %8.3f s %7.2f GB/s  (%.2fx read, %.2fx XXH3)\n", "zckpt verify", t_verify, gbps(t_verify),
                t_read / t_verify, t_xxh3 / t_verify);
  }
  return kExitOk;
}

}  // namespace zckpt::cli
