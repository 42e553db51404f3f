#include "hardening_util.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>

#include "format/container_file.h"
#include "test_util.h"
#include "torch_pickle.h"
#include "zckpt/format.h"

extern char** environ;

namespace zckpt::hardening {

using format::internal::ContainerFile;

namespace {

// FNV-style mixing of 64-bit values into a running digest (order-sensitive).
void Mix(uint64_t& h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
}

void MixBytes(uint64_t& h, const void* p, size_t n) { Mix(h, format::Checksum(p, n)); }
void MixString(uint64_t& h, std::string_view s) { MixBytes(h, s.data(), s.size()); }

}  // namespace

void WriteSampleContainer(const std::string& path, uint64_t seed, unsigned storages, uint64_t max_storage_bytes,
                          int zstd_level, uint64_t chunk_bytes) {
  WriterOptions o;
  o.zstd_level = zstd_level;
  o.chunk_bytes = chunk_bytes;
  o.threads = 2;
  ContainerWriter w(path, o);
  std::mt19937_64 rng(seed);
  std::vector<testing::PickledStorage> pickled_storages;
  std::vector<testing::PickledTensor> pickled_tensors;
  for (unsigned s = 0; s < storages; ++s) {
    // Sizes spread over small (64-byte aligned) and large (4 KiB aligned, several chunks) storages.
    uint64_t n = s == 0 ? 0 : (s % 3 == 0 ? max_storage_bytes : 4 + rng() % (s % 3 == 1 ? 1000 : max_storage_bytes));
    n = n / 4 * 4;
    std::vector<uint8_t> bytes(n);
    if (s % 2 == 0) {
      for (uint64_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>((i / 64) ^ s);  // compressible
    } else {
      for (uint64_t i = 0; i < n; i += 8) {
        uint64_t r = rng();
        std::memcpy(bytes.data() + i, &r, std::min<uint64_t>(8, n - i));
      }
    }
    NewStorage ns{"s" + std::to_string(s), s % 4 == 3 ? "cuda:0" : "cpu", DType::kFloat32, false};
    uint32_t index;
    if (s % 2 == 0) {
      index = w.AddStorage(ns, bytes);
    } else {
      index = w.BeginStorage(ns, bytes.size());
      for (uint64_t off = 0; off < n; off += 5000) w.AppendStorage(std::span<const uint8_t>(bytes).subspan(off, std::min<uint64_t>(5000, n - off)));
      w.EndStorage();
    }
    NewTensor t;
    t.name = "t" + std::to_string(s) + ".weight";
    t.storage = index;
    t.dtype = DType::kFloat32;
    t.shape = {static_cast<int64_t>(n / 4)};
    t.stride = {1};
    w.AddTensor(t);
    pickled_storages.push_back({ns.key, ns.location, "FloatStorage", n / 4});
    pickled_tensors.push_back({t.name, s, 0, t.shape, t.stride, false});
    if (n >= 16) {
      NewTensor v = t;
      v.name = "t" + std::to_string(s) + ".view";
      v.shape = {2, 2};
      v.stride = {1, 2};
      v.storage_offset = 0;
      v.flags = format::kTensorRequiresGrad;
      w.AddTensor(v);
      pickled_tensors.push_back({v.name, s, 0, v.shape, v.stride, true});
    }
  }
  // A real object pickle describing exactly these tensors, as torch.save would: loaders check it
  // against the index and build the object tree from it.
  std::string blob = testing::TorchStateDictPickle(pickled_storages, pickled_tensors);
  w.AddBlob("data.pkl", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(blob.data()), blob.size()));
  w.SetMetadata("zckpt.hardening.seed", std::to_string(seed));
  w.Commit();
}

uint64_t CopyWithCorruptMiddleChunk(const std::string& path, const std::string& out, uint64_t at, uint8_t mask) {
  std::vector<uint8_t> bytes = testing::ReadFileBytes(path);
  uint64_t victim;
  {
    auto c = Container::Open(path);
    victim = c->chunk_count() / 2;
    bytes[c->chunk(victim).offset + at] ^= mask;
  }
  testing::WriteFileBytes(out, bytes);
  return victim;
}

CancelAfter::CancelAfter(std::atomic<bool>& flag, int us)
    : thread_([&flag, us] {
        std::this_thread::sleep_for(std::chrono::microseconds(us));
        flag = true;
      }) {}

CancelAfter::~CancelAfter() { thread_.join(); }

uint64_t DigestContainer(const Container& c) {
  uint64_t h = 0;
  Mix(h, c.storage_count());
  Mix(h, c.chunk_count());
  Mix(h, c.tensor_count());
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < c.chunk_count(); ++i) {
    format::ChunkRecord r = c.chunk(i);
    buf.resize(r.raw_bytes);
    c.ReadChunk(i, buf.data(), true);
    MixBytes(h, buf.data(), buf.size());
  }
  for (uint32_t s = 0; s < c.storage_count(); ++s) {
    StorageInfo si = c.storage(s);
    MixString(h, si.key);
    MixString(h, si.location);
    Mix(h, si.raw_bytes);
    Mix(h, static_cast<uint64_t>(si.dtype));
  }
  for (uint32_t t = 0; t < c.tensor_count(); ++t) {
    TensorInfo ti = c.tensor(t);
    MixString(h, ti.name);
    Mix(h, ti.storage);
    for (int64_t d : ti.shape) Mix(h, static_cast<uint64_t>(d));
    for (int64_t d : ti.stride) Mix(h, static_cast<uint64_t>(d));
    Mix(h, ti.storage_offset);
    Mix(h, ti.flags);
  }
  for (uint32_t b = 0; b < c.blob_count(); ++b) {
    BlobInfo bi = c.blob(b);
    MixString(h, bi.name);
    if (bi.bytes) MixBytes(h, ContainerFile::Data(c) + bi.offset, bi.bytes);
  }
  for (uint32_t m = 0; m < c.metadata_count(); ++m) {
    auto [k, v] = c.metadata(m);
    MixString(h, k);
    MixString(h, v);
  }
  return h;
}

uint64_t DigestFile(const std::string& path) { return DigestContainer(*Container::Open(path)); }

uint64_t FileChecksum(const std::string& path) {
  std::vector<uint8_t> bytes = testing::ReadFileBytes(path);
  return format::Checksum(bytes.data(), bytes.size());
}

double EnvDouble(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

std::string ZckptTool() {
  std::string p = testing::BuildRoot() + "/tools/zckpt";
  return access(p.c_str(), X_OK) == 0 ? p : "";
}

bool ZckptLoadAvailable() {
  static const bool ok = [] {
    std::string tool = ZckptTool();
    return !tool.empty() && testing::RunCommand(testing::ShellQuote(tool) + " load --help") == 0;
  }();
  return ok;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  std::string out = log.empty() ? "/dev/null" : log;
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool IsTempOf(const std::string& entry, const std::string& dest_name) {
  std::string prefix = "." + dest_name + ".zckpt-tmp-";
  return entry.size() > prefix.size() && entry.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::string> UnexpectedEntries(const std::string& dir, const std::vector<std::string>& keep,
                                           const std::string& dest_name) {
  std::vector<std::string> bad;
  for (const std::string& e : testing::ListDir(dir)) {
    bool kept = false;
    for (const std::string& k : keep) kept = kept || e == k;
    if (!kept && !IsTempOf(e, dest_name)) bad.push_back(e);
  }
  return bad;
}

}  // namespace zckpt::hardening
