#include "loader_test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>

#include "zckpt/dtype.h"

namespace zckpt::testing {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

std::vector<uint8_t> CompressibleBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>((i / 64 + seed) % 7);
  return out;
}

uint32_t Fixture::AddStorage(const std::string& key, std::vector<uint8_t> bytes, DType dtype) {
  NewStorage s;
  s.key = key;
  s.dtype = dtype;
  s.location = "cuda:0";  // never decides anything: every test loads it elsewhere
  storages_.push_back(s);
  bytes_[key] = std::move(bytes);
  return static_cast<uint32_t>(storages_.size() - 1);
}

void Fixture::AddTensor(const std::string& name, uint32_t storage, DType dtype, std::vector<int64_t> shape,
                        std::vector<int64_t> stride, uint64_t storage_offset, uint32_t flags) {
  tensors_.push_back(NewTensor{name, storage, dtype, std::move(shape), std::move(stride), storage_offset, flags, ""});
}

void Fixture::AddContiguous(const std::string& name, DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  std::vector<int64_t> stride(shape.size());
  int64_t numel = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    stride[i] = numel;
    numel *= shape[i];
  }
  std::vector<uint8_t> bytes = RandomBytes(static_cast<size_t>(numel) * DTypeSize(dtype), seed);
  if (dtype == DType::kBool)
    for (auto& b : bytes) b &= 1;
  uint32_t s = AddStorage("s" + name, std::move(bytes), dtype);
  AddTensor(name, s, dtype, std::move(shape), std::move(stride));
}

void Fixture::Write(const std::string& path, const WriterOptions& options) const {
  ContainerWriter w(path, options);
  for (const auto& s : storages_) w.AddStorage(s, bytes_.at(s.key));
  for (const auto& t : tensors_) w.AddTensor(t);
  for (const auto& [name, bytes] : blobs_) w.AddBlob(name, bytes);
  w.Commit();
}

std::string Fixture::WriteIn(const TempDir& dir, const std::string& name, const WriterOptions& options) const {
  std::string path = dir.File(name);
  Write(path, options);
  return path;
}

std::string Fixture::WriteIn(const TempDir& dir, const std::string& name) const {
  return WriteIn(dir, name, SmallChunks());
}

WriterOptions SmallChunks(uint64_t chunk_bytes, int zstd_level) {
  WriterOptions o;
  o.chunk_bytes = chunk_bytes;
  o.zstd_level = zstd_level;
  o.threads = 1;
  return o;
}

std::vector<uint8_t> BytesOf(const at::Tensor& bytes) {
  at::Tensor cpu = bytes.is_cpu() ? bytes : bytes.to(c10::Device(c10::kCPU));
  const auto* p = static_cast<const uint8_t*>(cpu.data_ptr());
  return std::vector<uint8_t>(p, p + cpu.numel());
}

bool SameBytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  auto flat = [](const at::Tensor& t) { return BytesOf(t.resolve_conj().resolve_neg().contiguous().reshape({-1}).view(at::kByte)); };
  return flat(a) == flat(b);
}

void FlipBit(const std::string& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  uint8_t b = 0;
  if (pread(fd, &b, 1, static_cast<off_t>(offset)) != 1) throw std::runtime_error("cannot read " + path);
  b ^= 0x10;
  if (pwrite(fd, &b, 1, static_cast<off_t>(offset)) != 1) throw std::runtime_error("cannot write " + path);
  ::close(fd);
}

void ReadWhole(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  std::vector<char> buf(1 << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

size_t ThreadCount() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

size_t ThreadCountSettled(size_t expected) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  size_t n = ThreadCount();
  while (n > expected && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = ThreadCount();
  }
  return n;
}

}  // namespace zckpt::testing
