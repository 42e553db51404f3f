// `zckpt bench verify FILE`: what checking costs, against baselines measured in the same run.
//
// The machines this runs on are shared and noisy, so one timing means little. Each round runs
// every measurement once, in an order shuffled afresh, and the report gives min / median / max
// over the rounds and the verify's ratio to each baseline round by round (paired), with the
// 1-minute load average before and after. The file is in the page cache (a warm-up read first)
// for all of them, so they compare like with like:
//   read        a sequential read(2) of the file into a 1 MiB buffer (`cat FILE > /dev/null`)
//   xxh3-cache  XXH3 on one core over a 512 KiB buffer that stays in cache, as many bytes as the
//               file: the CPU cost per byte of checking, the loader's case (it hashes each piece
//               right after reading it)
//   xxh3-map    XXH3 on one core over the file's mapping: bound by memory bandwidth too
//   verify      Container::Verify with --threads (default: all hardware threads)
// Load benchmarks (peers, floors, warm and cold): tools/bench/bench.py.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "json_writer.h"
#include "progress.h"
#include "zckpt/container.h"
#include "zckpt/format.h"

namespace zckpt::cli {

namespace {

constexpr const char* kHelp =
    "usage: zckpt bench verify FILE [--rounds N] [--threads N] [--json]\n\n"
    "Times `zckpt verify` of FILE against, in the same rounds and with the file in the page\n"
    "cache: a sequential read of the file (what `cat FILE > /dev/null` does), XXH3 on one core\n"
    "over bytes in cache (the CPU cost of checking) and over the file's mapping. Each of\n"
    "--rounds (default 5) runs every measurement once in a shuffled order; prints min/median/max\n"
    "seconds, GB/s of the medians, the verify's paired ratios and the load average.\n"
    "Load benchmarks (torch.load, safetensors, tensorizer, fastsafetensors, Run:ai, floors;\n"
    "warm and cold): tools/bench/bench.py. Convert benchmark (against cp):\n"
    "tools/bench/bench_convert.py; safetensors convert and load (against load_file):\n"
    "tools/bench/bench_safetensors.py.\n\n"
    "Exit codes:\n"
    "  0  measured\n"
    "  1  the file is corrupt\n"
    "  2  could not run: bad usage, a missing file, not a container, an I/O error\n";

double Seconds(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A regular file read front to back (the container opened it, so it is one; O_NONBLOCK keeps a
// FIFO swapped in since from blocking the open).
void SequentialRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(ErrorKind::kIo, path + ": cannot open: " + std::strerror(errno));
  std::vector<char> buf(1 << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

double LoadAverage() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int RunBench(const Argv& argv) {
  Args args(argv, {"help", "json"}, {"rounds", "repeat", "threads"}, {{"h", "help"}});
  if (!args.ok()) return UsageError("bench", args.error());
  if (args.Has("help") || args.positional().empty()) {
    std::fputs(kHelp, args.Has("help") ? stdout : stderr);
    return args.Has("help") ? kExitOk : kExitCannotRun;
  }
  if (args.positional()[0] != "verify" || args.positional().size() != 2)
    return UsageError("bench", "expected: zckpt bench verify FILE (load benchmarks: tools/bench/bench.py)");
  const std::string path = args.positional()[1];
  auto rounds_opt = args.GetInt("rounds");
  auto repeat = args.GetInt("repeat");  // the former name of --rounds
  auto threads = args.GetInt("threads");
  if (!args.ok()) return UsageError("bench", args.error());
  int rounds = static_cast<int>(rounds_opt.value_or(repeat.value_or(5)));
  if (rounds < 1) return UsageError("bench", "--rounds must be >= 1");

  auto container = Container::Open(path);
  const uint64_t bytes = container->file_bytes();
  SequentialRead(path);  // warm the page cache for every measurement
  // The hash of the whole file in one call, over a mapping of its own (the cost verify's threads
  // share out).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  void* mapping = fd < 0 ? MAP_FAILED : mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (fd >= 0) ::close(fd);
  if (mapping == MAP_FAILED) {
    std::fprintf(stderr, "zckpt bench: cannot map %s: %s\n", path.c_str(), std::strerror(errno));
    return kExitCannotRun;
  }
  struct Unmap {
    void* p;
    uint64_t n;
    ~Unmap() { munmap(p, n); }
  } unmap{mapping, bytes};

  constexpr size_t kPiece = 512 << 10;
  std::vector<uint8_t> piece(kPiece);
  for (size_t i = 0; i < kPiece; ++i) piece[i] = static_cast<uint8_t>(i * 131 + 7);
  volatile uint64_t sink = 0;
  VerifyOptions opt;
  if (threads) opt.threads = static_cast<unsigned>(*threads);
  bool ok = true;

  struct Measure {
    const char* name;
    std::function<void()> fn;
    std::vector<double> s;
  };
  std::vector<Measure> m = {
      {"sequential read (cat)", [&] { SequentialRead(path); }, {}},
      {"XXH3, 1 core, in cache", [&] {
         uint64_t h = 0;
         for (uint64_t done = 0; done < bytes; done += kPiece) {
           piece[0] = static_cast<uint8_t>(done);  // a different input each time
           h ^= format::Checksum(piece.data(), std::min<uint64_t>(kPiece, bytes - done));
         }
         sink = sink + h;
       }, {}},
      {"XXH3, 1 core, file mapping", [&] { sink = sink + format::Checksum(mapping, bytes); }, {}},
      {"zckpt verify", [&] { ok = container->Verify(opt).ok() && ok; }, {}},
  };
  const size_t kVerify = 3;
  std::mt19937 rng(1);
  std::vector<size_t> order(m.size());
  double load_min = 1e9, load_max = -1;
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      double l = LoadAverage();
      m[i].s.push_back(Seconds(m[i].fn));
      double l2 = LoadAverage();
      load_min = std::min({load_min, l, l2});
      load_max = std::max({load_max, l, l2});
    }
  }
  if (!ok) {
    std::fprintf(stderr, "zckpt bench: %s does not verify; run `zckpt verify` for details\n", path.c_str());
    return kExitBad;
  }
  auto gbps = [&](double s) { return static_cast<double>(bytes) / s / 1e9; };
  auto paired = [&](size_t base) {  // baseline seconds / verify seconds, round by round: median
    std::vector<double> v;
    for (int r = 0; r < rounds; ++r) v.push_back(m[base].s[r] / m[kVerify].s[r]);
    return Median(v);
  };
  const char* kernel = format::ChecksumKernel();
  unsigned hw = std::thread::hardware_concurrency();
  if (args.Has("json")) {
    JsonWriter j;
    j.BeginObject().Key("file").String(path).Key("bytes").UInt(bytes).Key("rounds").Int(rounds);
    j.Key("xxh3_kernel").String(kernel).Key("hardware_threads").UInt(hw);
    j.Key("loadavg_min").Double(load_min).Key("loadavg_max").Double(load_max);
    const char* keys[] = {"read", "xxh3_cache", "xxh3_map", "verify"};
    for (size_t i = 0; i < m.size(); ++i) {
      std::vector<double> s = m[i].s;
      std::sort(s.begin(), s.end());
      j.Key(std::string(keys[i]) + "_seconds_median").Double(Median(s));
      j.Key(std::string(keys[i]) + "_seconds_min").Double(s.front());
      j.Key(std::string(keys[i]) + "_seconds_max").Double(s.back());
    }
    j.Key("xxh3_cache_gbps").Double(gbps(Median(m[1].s)));
    j.Key("verify_vs_read_paired").Double(paired(0)).Key("verify_vs_xxh3_map_paired").Double(paired(2));
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("%s: %s, %d rounds (shuffled order), page cache warm, %u hardware threads, XXH3 kernel %s\n",
                path.c_str(), FormatBytes(bytes).c_str(), rounds, hw, kernel);
    std::printf("  %-28s %8s %8s %8s %8s\n", "", "min s", "median s", "max s", "GB/s");
    for (auto& x : m) {
      std::vector<double> s = x.s;
      std::sort(s.begin(), s.end());
      std::printf("  %-28s %8.3f %8.3f %8.3f %8.2f\n", x.name, s.front(), Median(s), s.back(), gbps(Median(s)));
    }
    std::printf("  verify vs read (paired, >1: verify faster): %.2fx; vs XXH3 of the mapping on 1 core: %.2fx\n",
                paired(0), paired(2));
    std::printf("  load average (1 min) during the rounds: %.2f-%.2f (a shared machine: compare ratios)\n", load_min,
                load_max);
  }
  return kExitOk;
}

}  // namespace zckpt::cli
