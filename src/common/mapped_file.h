// A read-only memory mapping of a whole file.
//
// Every reader in zckpt (container, .pt archive) works on a mapping rather than on buffers it
// fills: a 34 GiB shard must be readable on a machine with less RAM than that, and the kernel
// can drop clean mapped pages under pressure where it could not drop our heap copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zckpt {

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE, so a caller may ask for a copy-on-write view later).
  // Throws Error(kIo) naming the path on failure. An empty file maps to data()==nullptr, size 0.
  explicit MappedFile(const std::string& path);
  // Wraps caller-owned memory (tests, fuzzers); nothing is unmapped on destruction.
  MappedFile(const void* data, size_t size, std::string name);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool owns_mapping() const { return owned_; }

  // Tells the kernel how [offset, offset+len) will be used (MADV_SEQUENTIAL / MADV_WILLNEED /
  // MADV_DONTNEED). Offsets are rounded out to pages; errors are ignored (advice only).
  void AdviseSequential(uint64_t offset, uint64_t len) const;
  void AdviseWillNeed(uint64_t offset, uint64_t len) const;
  // Drops the pages of a range that has been consumed, so a streaming pass keeps its resident
  // set bounded by what is in flight rather than by the file size.
  void Release(uint64_t offset, uint64_t len) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  bool owned_ = false;
};

}  // namespace zckpt
