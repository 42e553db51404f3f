// A read-only file: its descriptor for checked reads, and a memory mapping of all of it.
//
// Two ways in, for two kinds of reader:
// - ReadAt (pread): what every check reads through. The bytes land in the caller's memory, so a
//   value that was checked cannot change afterwards, and a file that shrank since it was opened
//   gives a short read, hence an Error naming the file, never a SIGBUS.
// - data() (the mapping): zero-copy views of bytes nobody checks again (a .pt's storages while
//   converting, `Map`'s tensors, the loader's mmap method). Another process may rewrite those
//   bytes, or truncate the file so that touching them raises SIGBUS: a reader of the mapping
//   either accepts that (and says so) or copies through GuardedCopy (common/fault_guard.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/byte_source.h"
#include "common/open_file.h"
#include <memory>

namespace zckpt {

class MappedFile {
 public:
  // Opens `path` with OpenRegularFile (never blocks: a FIFO or device is refused) and maps it
  // read-only (MAP_PRIVATE). Throws Error(kIo) naming the path on failure. An empty file maps to
  // data()==nullptr, size 0.
  explicit MappedFile(const std::string& path);
  // Wraps caller-owned memory (tests, fuzzers); nothing is unmapped on destruction.
  MappedFile(const void* data, size_t size, std::string name);
  // Bytes from elsewhere (common/byte_source.h): no mapping (data() is nullptr), no descriptor
  // (fd() is -1); ReadAt reads through the source, the advice calls do nothing.
  explicit MappedFile(std::unique_ptr<ByteSource> source);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }  // when opened
  const std::string& path() const { return path_; }
  bool owns_mapping() const { return owned_; }
  int fd() const { return fd_.get(); }  // -1 for caller-owned memory and remote sources
  // The remote source, or nullptr for a local file or caller-owned memory.
  const ByteSource* remote() const { return source_.get(); }

  // Copies [offset, offset+n) into dst (pread, or memcpy for caller-owned memory). Throws
  // Error(kIo) naming the file and the byte range when the range is past size() or when fewer
  // bytes come back (the file shrank since it was opened), or on a read error.
  void ReadAt(uint64_t offset, uint64_t n, void* dst) const;
  // ReadAt of the bytes a view of data() covers: how a parser that found a range in the mapping
  // reads it privately (the bytes it then uses are the ones it read, once). CopyView returns them.
  void ReadView(std::span<const uint8_t> view, void* dst) const;
  std::vector<uint8_t> CopyView(std::span<const uint8_t> view) const;

  // Tells the kernel how [offset, offset+len) will be used (MADV_SEQUENTIAL / MADV_WILLNEED /
  // MADV_DONTNEED for the mapping; SEQUENTIAL also as posix_fadvise for ReadAt). Offsets are
  // rounded out to pages; errors are ignored (advice only).
  void AdviseSequential(uint64_t offset, uint64_t len) const;
  void AdviseWillNeed(uint64_t offset, uint64_t len) const;
  // Drops the mapped pages of a range that has been consumed, so a streaming pass over the
  // mapping keeps its resident set bounded by what is in flight rather than by the file size.
  void Release(uint64_t offset, uint64_t len) const;

 private:
  uint64_t OffsetOf(std::span<const uint8_t> view) const;

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  bool owned_ = false;
  FileDescriptor fd_;
  std::unique_ptr<ByteSource> source_;
};

// "PATH: the file changed size while being read (truncated by another process?): file bytes
// [BEGIN, END) are gone" -- the one message for a file that shrank under a reader.
std::string FileShrankMessage(const std::string& path, uint64_t begin, uint64_t end);

}  // namespace zckpt
