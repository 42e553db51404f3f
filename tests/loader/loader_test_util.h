// Building test containers for the loader suites and comparing what was loaded with the bytes
// that were written.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"
#include "zckpt/container_writer.h"

namespace zckpt::testing {

// Deterministic pseudo-random bytes.
std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed);
// Bytes that zstd shrinks (runs and a short period), for compressed chunks.
std::vector<uint8_t> CompressibleBytes(size_t n, uint64_t seed);

// A container described in memory, then written with ContainerWriter.
class Fixture {
 public:
  uint32_t AddStorage(const std::string& key, std::vector<uint8_t> bytes, DType dtype = DType::kUInt8);
  void AddTensor(const std::string& name, uint32_t storage, DType dtype, std::vector<int64_t> shape,
                 std::vector<int64_t> stride, uint64_t storage_offset = 0, uint32_t flags = 0);
  // A storage of its own (key "s<name>") holding a contiguous tensor of random bytes.
  void AddContiguous(const std::string& name, DType dtype, std::vector<int64_t> shape, uint64_t seed);
  void AddBlob(const std::string& name, std::vector<uint8_t> bytes) { blobs_.emplace_back(name, std::move(bytes)); }
  void Write(const std::string& path, const WriterOptions& options) const;
  // Writes `name` in `dir` (4 KiB chunks unless told otherwise); returns its path.
  std::string WriteIn(const TempDir& dir, const std::string& name, const WriterOptions& options) const;
  std::string WriteIn(const TempDir& dir, const std::string& name) const;

  const std::vector<uint8_t>& bytes(const std::string& key) const { return bytes_.at(key); }
  const std::vector<NewTensor>& tensors() const { return tensors_; }
  const std::vector<NewStorage>& storages() const { return storages_; }
  std::string key_of(const NewTensor& t) const { return storages_[t.storage].key; }

 private:
  std::vector<NewStorage> storages_;
  std::map<std::string, std::vector<uint8_t>> bytes_;
  std::vector<NewTensor> tensors_;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> blobs_;
};

// WriterOptions with a small chunk size, so tests span many chunks quickly.
WriterOptions SmallChunks(uint64_t chunk_bytes = 4096, int zstd_level = 0);

// A CPU copy of a 1-D uint8 tensor's bytes.
std::vector<uint8_t> BytesOf(const at::Tensor& bytes);
// Same shape and the same bytes element for element (random bytes make NaNs, which == refuses).
bool SameBytes(const at::Tensor& a, const at::Tensor& b);
// Flips one bit of the file at `offset`.
void FlipBit(const std::string& path, uint64_t offset);
// Reads the whole file so every page is cached.
void ReadWhole(const std::string& path);
// Threads of this process (/proc/self/task).
size_t ThreadCount();
// ThreadCount() once it has dropped to `expected` or 2 s have passed. A thread is still listed
// for a moment after pthread_join returns (the kernel wakes the joiner when the thread clears its
// id, before the task is reaped): on a loaded machine a count taken right away sees it. A thread
// never joined stays listed, and the count stays above `expected`.
size_t ThreadCountSettled(size_t expected);

}  // namespace zckpt::testing
