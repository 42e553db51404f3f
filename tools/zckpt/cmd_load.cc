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

// What every mode reports: the bytes it made available, the time and CPU it took, the host
// memory around it and, on CUDA, the device memory.
struct Measured {
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  double seconds = 0;
  double cpu_seconds = 0;  // user + system time of every thread during the load
  HostMemory before, after;
  bool host_peak_reset = false;
  int cuda_index = -1;
  uint64_t device_allocated = 0;  // device bytes the load itself allocated (its destination)
  CudaMemory device_before, device_after;
};

// A load through the streaming loader (into fresh memory, or --into memory of its own).
struct StreamReport {
  Measured measured;
  LoadStats stats;
};

// --map: storages aliasing the file's mapping.
struct MapReport {
  Measured measured;
  bool verified = false;
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

// Runs `body` (which returns the bytes it made available) between the memory and CPU probes
// of the report. What it loaded must outlive this call, so that the device figures read after
// it count the result.
template <class Body>
Measured Measure(int device, Body&& body) {
  Measured m;
  m.cuda_index = device;
  if (device >= 0) m.device_before = ReadCudaMemory(device);
  m.host_peak_reset = ResetHostPeak();
  m.before = ReadHostMemory();
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  m.bytes = body();
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.cpu_seconds = CpuSeconds() - cpu0;
  m.after = ReadHostMemory();
  if (device >= 0) m.device_after = ReadCudaMemory(device);
  return m;
}

// A load into fresh memory: one buffer per storage, allocated as part of the load.
StreamReport LoadFresh(const std::string& path, int device, const LoadOptions& options) {
  std::unique_ptr<Container> c = Container::Open(path);
  Destination fresh;
  StreamReport r;
  r.measured = Measure(device, [&] {
    CheckObjectPickle(*c, options.allow_globals);
    fresh = PerStorage(*c, device);
    r.stats = LoadRanges(*c, fresh.targets, options);
    return r.stats.raw_bytes;
  });
  if (device >= 0)
    for (const auto& b : fresh.buffers) r.measured.device_allocated += b->bytes();
  r.measured.tensors = c->tensor_count();
  return r;
}

// --into: each tensor into memory of its own, allocated and zeroed before the load.
StreamReport LoadInPlace(const std::string& path, int device, const LoadOptions& options) {
  std::unique_ptr<Container> c = Container::Open(path);
  Destination into = PerTensor(*c, device);
  StreamReport r;
  r.measured = Measure(device, [&] {
    CheckObjectPickle(*c, options.allow_globals);
    r.stats = LoadRanges(*c, into.targets, options);
    return r.stats.raw_bytes;
  });
  r.measured.tensors = c->tensor_count();
  return r;
}

// --map: the file mapped, every chunk checked in the mapping first unless verify is off.
MapReport MapAll(const std::string& path, const LoadOptions& options) {
  std::unique_ptr<Container> c = Container::Open(path);
  std::unique_ptr<MappedStorages> mapped;
  MapReport r;
  r.measured = Measure(-1, [&] {
    CheckObjectPickle(*c, options.allow_globals);
    mapped = std::make_unique<MappedStorages>(*c, options.verify, options.threads.value_or(DefaultReaderThreads()));
    return mapped->mapped_bytes() + mapped->decoded_bytes();
  });
  r.verified = options.verify;
  r.measured.tensors = c->tensor_count();
  return r;
}

double Gbps(const Measured& m) { return m.seconds > 0 ? static_cast<double>(m.bytes) / m.seconds / 1e9 : 0; }

// The keys every mode's JSON report starts with, through "tensors".
void JsonHead(JsonWriter& jw, const std::string& path, Mode mode, const std::string& device, const Measured& m) {
  jw.BeginObject().Key("file").String(path).Key("status").String("ok").Key("mode").String(ModeName(mode));
  jw.Key("device").String(device).Key("bytes").UInt(m.bytes).Key("seconds").Double(m.seconds).Key("cpu_seconds").Double(m.cpu_seconds).Key("gbps").Double(Gbps(m));
  jw.Key("tensors").UInt(m.tensors);
}

// The memory keys every mode's JSON report ends with; prints the report.
void JsonTail(JsonWriter& jw, const Measured& m) {
  jw.Key("rss_before").UInt(m.before.rss).Key("rss_peak").UInt(m.after.peak);
  jw.Key("rss_peak_delta").UInt(Delta(m.after.peak, m.before.rss)).Key("rss_peak_exact").Bool(m.host_peak_reset);
  if (m.cuda_index >= 0) {
    jw.Key("device_peak_bytes").UInt(m.device_allocated);
    jw.Key("device_used_delta").UInt(Delta(m.device_before.free, m.device_after.free));
    jw.Key("device_free_after").UInt(m.device_after.free);
  }
  jw.EndObject();
  std::printf("%s\n", jw.str().c_str());
}

void PrintJson(const std::string& path, Mode mode, const std::string& device, const StreamReport& r) {
  JsonWriter jw;
  JsonHead(jw, path, mode, device, r.measured);
  const LoadStats& s = r.stats;
  jw.Key("verified").Bool(s.verified).Key("method").String(ReadMethodName(s.method));
  jw.Key("threads").UInt(s.threads).Key("slots").UInt(s.slots).Key("slot_bytes").UInt(s.slot_bytes);
  jw.Key("ring_bytes").UInt(s.ring_bytes).Key("stored_bytes").UInt(s.stored_bytes);
  jw.Key("chunks").UInt(s.chunks).Key("destination_chunks").UInt(s.destination_chunks).Key("uncached_bytes").UInt(s.uncached_bytes).Key("storages").UInt(s.storages);
  jw.Key("read_seconds").Double(s.read_seconds).Key("hash_seconds").Double(s.hash_seconds);
  jw.Key("copy_seconds").Double(s.copy_seconds).Key("wait_seconds").Double(s.wait_seconds);
  JsonTail(jw, r.measured);
}

void PrintJson(const std::string& path, const MapReport& r) {
  JsonWriter jw;
  JsonHead(jw, path, Mode::kMap, "cpu", r.measured);
  jw.Key("verified").Bool(r.verified);
  JsonTail(jw, r.measured);
}

// The first line of every mode's text report.
void TextHead(const std::string& path, const char* verb, const std::string& device, const Measured& m,
              const char* suffix) {
  std::printf("%s: %s %s (%llu tensors) to %s in %.3f s (%.3f s CPU), %.2f GB/s%s\n", Printable(path).c_str(), verb,
              FormatBytes(m.bytes).c_str(), static_cast<unsigned long long>(m.tensors), device.c_str(), m.seconds,
              m.cpu_seconds, Gbps(m), suffix);
}

// The memory lines every mode's text report ends with.
void TextTail(const Measured& m) {
  std::printf("  host RSS: peak %s (+%s over %s before the load)%s\n", FormatBytes(m.after.peak).c_str(),
              FormatBytes(Delta(m.after.peak, m.before.rss)).c_str(), FormatBytes(m.before.rss).c_str(),
              m.host_peak_reset ? "" : " [peak not resettable here: includes earlier use]");
  if (m.cuda_index >= 0)
    std::printf("  device cuda:%d: %s allocated by the load (its destination), %s more in use with the result "
                "alive (cudaMemGetInfo; %s free)\n",
                m.cuda_index, FormatBytes(m.device_allocated).c_str(),
                FormatBytes(Delta(m.device_before.free, m.device_after.free)).c_str(),
                FormatBytes(m.device_after.free).c_str());
}

void PrintText(const std::string& path, Mode mode, const std::string& device, const StreamReport& r) {
  const LoadStats& s = r.stats;
  TextHead(path, mode == Mode::kInto ? "loaded in place" : "loaded", device, r.measured,
           s.verified ? ", verified" : ", not verified");
  std::printf("  read: %s, %u threads, ring %u x %s, %llu chunks (%llu straight into the destination)\n",
              ReadMethodName(s.method), s.threads, s.slots, FormatBytes(s.slot_bytes).c_str(),
              static_cast<unsigned long long>(s.chunks), static_cast<unsigned long long>(s.destination_chunks));
  std::printf("  thread time: read %.3f s, hash %.3f s, copy %.3f s, wait %.3f s (summed over threads)\n",
              s.read_seconds, s.hash_seconds, s.copy_seconds, s.wait_seconds);
  TextTail(r.measured);
}

void PrintText(const std::string& path, const MapReport& r) {
  TextHead(path, "mapped", "cpu", r.measured, "");
  TextTail(r.measured);
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
  // 0 is the default, as for the library (zckpt/load_options.h).
  if (slots && *slots < 0) return UsageError("load", "--slots must be >= 0 (0: the default)");
  if (slot) options.slot_bytes = *slot;
  if (threads && *threads < 0) return UsageError("load", "--threads must be >= 0 (0: the default)");
  if (slots) options.slots = static_cast<unsigned>(*slots);
  if (threads) options.threads = static_cast<unsigned>(*threads);
  if (auto m = args.Get("method")) {
    auto method = ParseMethod(*m);
    if (!method) return UsageError("load", "--method must be auto, pread, mmap or direct");
    options.method = *method;
  }
  if (args.Has("into") && args.Has("map")) return UsageError("load", "--into and --map exclude each other");
  const Mode mode = args.Has("map") ? Mode::kMap : args.Has("into") ? Mode::kInto : Mode::kLoad;
  const std::string device_name = args.Get("device").value_or("cpu");
  std::optional<int> device = ParseDevice(device_name);
  if (!device) return UsageError("load", "bad --device '" + device_name + "' (cpu, cuda, cuda:N)");
  if (mode == Mode::kMap && *device >= 0) return UsageError("load", "--map gives CPU memory: no --device");
  bool json = args.Has("json");
  try {
    if (mode == Mode::kMap) {
      MapReport r = MapAll(path, options);
      if (json) PrintJson(path, r);
      else PrintText(path, r);
      return kExitOk;
    }
    std::unique_ptr<ProgressBar> bar;
    if (!json && *style != ProgressStyle::kNone) {
      bar = std::make_unique<ProgressBar>("load " + path, 0, *style);
      options.progress = [&bar](uint64_t done, uint64_t total) {
        bar->SetTotal(total);
        bar->Set(done);
      };
    }
    StreamReport r = mode == Mode::kInto ? LoadInPlace(path, *device, options) : LoadFresh(path, *device, options);
    if (bar) bar->Finish();
    if (json) PrintJson(path, mode, device_name, r);
    else PrintText(path, mode, device_name, r);
  } catch (const Error& caught) {
    Error e = WithNotAContainerHint(caught, path);  // `zckpt load x.pt`: convert it first
    if (!json) throw e;  // main prints "zckpt load: ..." and maps the kind to the exit code
    return PrintJsonError("load", path, e);
  }
  return kExitOk;
}

}  // namespace zckpt::cli
