// `zckpt load FILE`: streams a whole container into memory on a device and reports how fast and
// with how much memory: the loader's own benchmark and a quick health check. No torch: the
// destinations are LoadBuffers (host memory, or cudaMalloc of the CUDA runtime loaded at run
// time), filled by zckpt/load_ranges.h's LoadRanges as the Python module's loads are.
#include <sys/resource.h>

#include <chrono>
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
#include "zckpt/container.h"
#include "zckpt/inspect.h"
#include "zckpt/load_ranges.h"
#include "zckpt/memory_stats.h"

namespace zckpt::cli {

namespace {

constexpr const char* kHelp =
    "usage: zckpt load FILE [--device cpu|cuda[:N]] [--no-verify] [--slot-bytes N] [--slots N]\n"
    "                  [--threads N] [--method auto|pread|mmap|direct] [--ring-only] [--buffered]\n"
    "                  [--into | --map] [--json] [--allow-global MOD.NAME]...\n\n"
    "Loads every tensor of FILE onto the device (default cpu) through the streaming loader:\n"
    "--threads reader threads (default half the hardware threads, 2 to 8; from s3:// 8, their\n"
    "reads run as ranged GETs, up to ZCKPT_S3_CONNECTIONS (64) in flight) fill a ring of\n"
    "--slots host buffers (default threads + 2, at least 4) of --slot-bytes each (default max(chunk, 8 MiB)), pinned for cuda, checking each\n"
    "chunk's XXH3 (--no-verify skips that),\n"
    "while the previous ones are copied to the device. Reports bytes, seconds, GB/s, the peak\n"
    "host RSS (VmHWM, and its growth over the RSS before the load) and, on cuda, the peak device\n"
    "memory the load allocated (the destination: the ring is host memory) and how much less the\n"
    "device has free (cudaMemGetInfo) while the result is alive. The CUDA runtime is loaded when\n"
    "--device cuda first needs it: the system's libcudart (ZCKPT_CUDART=FILE names one).\n"
    "  --ring-only  cpu: copy every byte through the ring (by default large chunks are read\n"
    "           straight into the destination)\n"
    "  --buffered  cpu: read uncached bytes through the page cache too (by default bytes going\n"
    "           straight into the destination that are not cached are read with O_DIRECT)\n"
    "  --into   load each tensor into memory of its own allocated (and zeroed) beforehand, in place\n"
    "  --map    map the file instead: storages aliasing it, every chunk checked in the mapping\n"
    "           first (with --no-verify: nothing read)\n"
    "Before any data is read, the kept object pickle is read by zckpt's interpreter (its\n"
    "globals on the allowlist or allowed with --allow-global) and checked against the index.\n";
constexpr const char* kHelpTail =
    "\nExit codes:\n"
    "  0  loaded\n"
    "  1  the file is corrupt (a chunk fails its checksum, the pickle disagrees with the index)\n"
    "     or unsafe (its pickle names a refused global)\n"
    "  2  could not run: bad usage, missing file, not a container (a .pt or .safetensors file:\n"
    "     convert it first), no such device, I/O or CUDA error\n";

enum class Mode { kLoad, kInto, kMap };

struct Report {
  std::string device;
  Mode mode = Mode::kLoad;
  LoadStats stats;
  uint64_t bytes = 0;
  double seconds = 0;
  double cpu_seconds = 0;  // user + system time of every thread during the load
  uint64_t tensors = 0;
  HostMemory before, after;
  bool host_peak_reset = false;
  int cuda_index = -1;
  uint64_t device_allocated = 0;  // device bytes the load itself allocated (its destination)
  CudaMemory device_before, device_after;
};

const char* ModeName(Mode m) { return m == Mode::kLoad ? "load" : m == Mode::kInto ? "into" : "map"; }

std::optional<ReadMethod> ParseMethod(const std::string& s) {
  for (ReadMethod m : {ReadMethod::kAuto, ReadMethod::kPread, ReadMethod::kMmap, ReadMethod::kDirect})
    if (s == ReadMethodName(m)) return m;
  return std::nullopt;
}

// "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N; nullopt for anything else.
std::optional<int> ParseDevice(const std::string& s) {
  if (s == "cpu") return -1;
  if (s == "cuda") return 0;
  if (s.rfind("cuda:", 0) != 0 || s.size() == 5 || s.size() > 9) return std::nullopt;
  int n = 0;
  for (char ch : s.substr(5)) {
    if (ch < '0' || ch > '9') return std::nullopt;
    n = n * 10 + (ch - '0');
  }
  return n;
}

uint64_t Delta(uint64_t after, uint64_t before) { return after > before ? after - before : 0; }

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// Where the bytes go: one buffer per storage (a load into fresh memory), or per tensor (--into:
// allocated and zeroed before the load starts, so they are the destination, not its cost).
struct Destination {
  std::vector<std::unique_ptr<LoadBuffer>> buffers;
  std::vector<LoadTarget> targets;
};

Destination PerStorage(const Container& c, int device) {
  Destination d;
  for (uint32_t i = 0; i < c.storage_count(); ++i) {
    uint64_t bytes = c.storage(i).raw_bytes;
    d.buffers.push_back(std::make_unique<LoadBuffer>(bytes, device));
    d.targets.push_back({i, 0, bytes, d.buffers.back()->data(), device});
  }
  return d;
}

Destination PerTensor(const Container& c, int device) {
  Destination d;
  for (uint32_t i = 0; i < c.tensor_count(); ++i) {
    TensorInfo t = c.tensor(i);
    d.buffers.push_back(std::make_unique<LoadBuffer>(t.byte_end - t.byte_begin, device));
    d.buffers.back()->Zero();
    d.targets.push_back({t.storage, t.byte_begin, t.byte_end, d.buffers.back()->data(), device});
  }
  return d;
}

// Runs the load of `mode` between the memory and CPU probes the report gives; what it loaded
// stays alive until the device figures are read.
void Run(const std::string& path, int device, Mode mode, const LoadOptions& options, Report* r) {
  std::unique_ptr<Container> c = Container::Open(path);
  Destination into;
  if (mode == Mode::kInto) into = PerTensor(*c, device);
  r->cuda_index = device;
  if (device >= 0) r->device_before = ReadCudaMemory(device);
  r->host_peak_reset = ResetHostPeak();
  r->before = ReadHostMemory();
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  CheckObjectPickle(*c, options.allow_globals);
  Destination fresh;
  std::unique_ptr<MappedStorages> mapped;
  if (mode == Mode::kMap) {
    mapped = std::make_unique<MappedStorages>(*c, options.verify, options.threads.value_or(DefaultReaderThreads()));
    r->stats.verified = options.verify;
    r->bytes = mapped->mapped_bytes() + mapped->decoded_bytes();
  } else {
    if (mode == Mode::kLoad) fresh = PerStorage(*c, device);
    r->stats = LoadRanges(*c, mode == Mode::kInto ? into.targets : fresh.targets, options);
    r->bytes = r->stats.raw_bytes;
    if (device >= 0)
      for (const auto& b : fresh.buffers) r->device_allocated += b->bytes();
  }
  r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r->cpu_seconds = CpuSeconds() - cpu0;
  r->after = ReadHostMemory();
  if (device >= 0) r->device_after = ReadCudaMemory(device);
  r->tensors = c->tensor_count();
}

void PrintJson(const std::string& path, const Report& r) {
  JsonWriter jw;
  double gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0;
  jw.BeginObject().Key("file").String(path).Key("status").String("ok").Key("mode").String(ModeName(r.mode));
  jw.Key("device").String(r.device).Key("bytes").UInt(r.bytes).Key("seconds").Double(r.seconds).Key("cpu_seconds").Double(r.cpu_seconds).Key("gbps").Double(gbps);
  jw.Key("tensors").UInt(r.tensors);
  if (r.mode == Mode::kMap) jw.Key("verified").Bool(r.stats.verified);
  if (r.mode != Mode::kMap) {
    const LoadStats& s = r.stats;
    jw.Key("verified").Bool(s.verified).Key("method").String(ReadMethodName(s.method));
    jw.Key("threads").UInt(s.threads).Key("slots").UInt(s.slots).Key("slot_bytes").UInt(s.slot_bytes);
    jw.Key("ring_bytes").UInt(s.ring_bytes).Key("stored_bytes").UInt(s.stored_bytes);
    jw.Key("chunks").UInt(s.chunks).Key("destination_chunks").UInt(s.destination_chunks).Key("uncached_bytes").UInt(s.uncached_bytes).Key("storages").UInt(s.storages);
    jw.Key("read_seconds").Double(s.read_seconds).Key("hash_seconds").Double(s.hash_seconds);
    jw.Key("copy_seconds").Double(s.copy_seconds).Key("wait_seconds").Double(s.wait_seconds);
  }
  jw.Key("rss_before").UInt(r.before.rss).Key("rss_peak").UInt(r.after.peak);
  jw.Key("rss_peak_delta").UInt(Delta(r.after.peak, r.before.rss)).Key("rss_peak_exact").Bool(r.host_peak_reset);
  if (r.cuda_index >= 0) {
    jw.Key("device_peak_bytes").UInt(r.device_allocated);
    jw.Key("device_used_delta").UInt(Delta(r.device_before.free, r.device_after.free));
    jw.Key("device_free_after").UInt(r.device_after.free);
  }
  jw.EndObject();
  std::printf("%s\n", jw.str().c_str());
}

void PrintText(const std::string& path, const Report& r) {
  double gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0;
  const char* verb = r.mode == Mode::kMap ? "mapped" : r.mode == Mode::kInto ? "loaded in place" : "loaded";
  std::printf("%s: %s %s (%llu tensors) to %s in %.3f s (%.3f s CPU), %.2f GB/s%s\n", Printable(path).c_str(), verb,
              FormatBytes(r.bytes).c_str(), static_cast<unsigned long long>(r.tensors), r.device.c_str(), r.seconds,
              r.cpu_seconds, gbps, r.mode == Mode::kMap ? "" : r.stats.verified ? ", verified" : ", not verified");
  if (r.mode != Mode::kMap) {
    const LoadStats& s = r.stats;
    std::printf("  read: %s, %u threads, ring %u x %s, %llu chunks (%llu straight into the destination)\n",
                ReadMethodName(s.method), s.threads, s.slots, FormatBytes(s.slot_bytes).c_str(),
                static_cast<unsigned long long>(s.chunks), static_cast<unsigned long long>(s.destination_chunks));
    std::printf("  thread time: read %.3f s, hash %.3f s, copy %.3f s, wait %.3f s (summed over threads)\n",
                s.read_seconds, s.hash_seconds, s.copy_seconds, s.wait_seconds);
  }
  std::printf("  host RSS: peak %s (+%s over %s before the load)%s\n", FormatBytes(r.after.peak).c_str(),
              FormatBytes(Delta(r.after.peak, r.before.rss)).c_str(), FormatBytes(r.before.rss).c_str(),
              r.host_peak_reset ? "" : " [peak not resettable here: includes earlier use]");
  if (r.cuda_index >= 0)
    std::printf("  device cuda:%d: %s allocated by the load (its destination), %s more in use with the result "
                "alive (cudaMemGetInfo; %s free)\n",
                r.cuda_index, FormatBytes(r.device_allocated).c_str(),
                FormatBytes(Delta(r.device_before.free, r.device_after.free)).c_str(),
                FormatBytes(r.device_after.free).c_str());
}

}  // namespace

int RunLoad(const Argv& argv) {
  Args args(argv, {"help", "json", "no-verify", "ring-only", "buffered", "into", "map"},
            {"device", "slot-bytes", "chunk-bytes", "slots", "threads", "j-threads", "method", "progress", "allow-global"},
            {{"h", "help"}, {"j", "j-threads"}});
  if (!args.ok()) return UsageError("load", args.error());
  if (args.Has("help")) {
    std::fputs(kHelp, stdout);
    std::fputs(kProgressHelp, stdout);
    std::fputs(kAllowGlobalHelp, stdout);
    std::fputs(kHelpTail, stdout);
    return kExitOk;
  }
  auto style = ChooseProgressStyle(args.Get("progress"));
  if (!style) return UsageError("load", "--progress takes auto, always or never");
  if (args.positional().size() != 1) return UsageError("load", "give exactly one FILE");
  const std::string path = args.positional()[0];
  LoadOptions options;
  options.verify = !args.Has("no-verify");
  options.allow_globals = args.GetAll("allow-global");
  options.cpu_read_into_destination = !args.Has("ring-only");
  options.direct_when_uncached = !args.Has("buffered");
  // Former spellings, for one release: --chunk-bytes is the chunk size in convert and merge, -j
  // the number of files at once (--jobs) in convert.
  WarnDeprecated(args, "load", "chunk-bytes", "--chunk-bytes", "the ring slot size is --slot-bytes");
  WarnDeprecated(args, "load", "j-threads", "-j", "reader threads are --threads (-j is --jobs in convert)");
  auto slot = args.Has("slot-bytes") ? args.GetSize("slot-bytes") : args.GetSize("chunk-bytes");
  auto slots = args.GetInt("slots");
  auto threads = args.Has("threads") ? args.GetInt("threads") : args.GetInt("j-threads");
  if (!args.ok()) return UsageError("load", args.error());
  if (slot && *slot < 1) return UsageError("load", "--slot-bytes must be >= 1");
  if (slots && *slots < 1) return UsageError("load", "--slots must be >= 1");
  if (slot) options.slot_bytes = *slot;
  if (threads && *threads < 1) return UsageError("load", "--threads must be >= 1");
  if (slots) options.slots = static_cast<unsigned>(*slots);
  if (threads) options.threads = static_cast<unsigned>(*threads);
  if (auto m = args.Get("method")) {
    auto method = ParseMethod(*m);
    if (!method) return UsageError("load", "--method must be auto, pread, mmap or direct");
    options.method = *method;
  }
  if (args.Has("into") && args.Has("map")) return UsageError("load", "--into and --map exclude each other");
  Report r;
  r.mode = args.Has("map") ? Mode::kMap : args.Has("into") ? Mode::kInto : Mode::kLoad;
  r.device = args.Get("device").value_or("cpu");
  std::optional<int> device = ParseDevice(r.device);
  if (!device) return UsageError("load", "bad --device '" + r.device + "' (cpu, cuda, cuda:N)");
  if (r.mode == Mode::kMap && *device >= 0) return UsageError("load", "--map gives CPU memory: no --device");
  bool json = args.Has("json");
  try {
    std::unique_ptr<ProgressBar> bar;
    if (!json && *style != ProgressStyle::kNone && r.mode != Mode::kMap) {
      bar = std::make_unique<ProgressBar>("load " + path, 0, *style);
      options.progress = [&bar](uint64_t done, uint64_t total) {
        bar->SetTotal(total);
        bar->Set(done);
      };
    }
    Run(path, *device, r.mode, options, &r);
    if (bar) bar->Finish();
  } catch (const Error& caught) {
    Error e = WithNotAContainerHint(caught, path);  // `zckpt load x.pt`: convert it first
    if (!json) throw e;  // main prints "zckpt load: ..." and maps the kind to the exit code
    return PrintJsonError("load", path, e);
  }
  if (json) PrintJson(path, r);
  else PrintText(path, r);
  return kExitOk;
}

}  // namespace zckpt::cli
