#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/fault_guard.h"
#include "common/pages.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

void Advise(const uint8_t* base, size_t size, uint64_t offset, uint64_t len, int advice) {
  if (base == nullptr || offset >= size || len == 0) return;
  uint64_t end = len > size - offset ? size : offset + len;
  // Offsets from the mapping's start, which is page-aligned. MADV_DONTNEED on a partial trailing
  // page would drop bytes still needed: the end is rounded down for it (up for the read-ahead
  // hints), and a range that reaches the end of the file ends there. The kernel rounds the length
  // up to its own page, which never leaves the mapping: a rounded end is clipped to the file's.
  uint64_t start = PageFloor(offset);
  uint64_t stop = advice == MADV_DONTNEED && end < size ? PageFloor(end) : std::min<uint64_t>(PageCeil(end), size);
  if (stop <= start) return;
  (void)madvise(const_cast<uint8_t*>(base) + start, stop - start, advice);
}

}  // namespace

std::string FileShrankMessage(const std::string& path, uint64_t begin, uint64_t end) {
  return path + ": the file changed size while being read (truncated by another process?): file bytes [" +
         std::to_string(begin) + ", " + std::to_string(end) + ") are gone";
}

MappedFile::MappedFile(const std::string& path) : path_(path), owned_(true) {
  struct stat st;
  fd_ = OpenRegularFile(path, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_.get(), 0);
    if (p == MAP_FAILED) throw Error(ErrorKind::kIo, "cannot mmap " + path + ": " + std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  }
}

MappedFile::MappedFile(const void* data, size_t size, std::string name)
    : data_(static_cast<const uint8_t*>(data)), size_(size), path_(std::move(name)), owned_(false) {}

MappedFile::MappedFile(std::unique_ptr<ByteSource> source)
    : size_(static_cast<size_t>(source->size())), path_(source->name()), source_(std::move(source)) {}

MappedFile::~MappedFile() {
  if (owned_ && data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::ReadAt(uint64_t offset, uint64_t n, void* dst) const {
  if (n == 0) return;
  if (offset > size_ || n > size_ - offset) throw Error(ErrorKind::kIo, FileShrankMessage(path_, offset, offset + n));
  if (source_) return source_->ReadAt(offset, n, dst);
  if (!owned_) {
    // Caller-owned memory may itself be a slice of another file's mapping (a .distcp item read
    // as its own archive): copied under the SIGBUS guard, so a truncation is this error too.
    if (!GuardedCopy(dst, data_ + offset, n)) throw Error(ErrorKind::kIo, FileShrankMessage(path_, offset, offset + n));
    return;
  }
  auto* out = static_cast<uint8_t*>(dst);
  for (uint64_t done = 0; done < n;) {
    ssize_t got = ::pread(fd_.get(), out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::kIo, "cannot read " + path_ + " at " + std::to_string(offset + done) + ": " +
                                      std::strerror(errno));
    }
    if (got == 0) throw Error(ErrorKind::kIo, FileShrankMessage(path_, offset + done, offset + n));
    done += static_cast<uint64_t>(got);
  }
}

void MappedFile::ReadView(std::span<const uint8_t> view, void* dst) const {
  ReadAt(OffsetOf(view), view.size(), dst);
}

std::vector<uint8_t> MappedFile::CopyView(std::span<const uint8_t> view) const {
  std::vector<uint8_t> out(view.size());
  ReadView(view, out.data());
  return out;
}

uint64_t MappedFile::OffsetOf(std::span<const uint8_t> view) const {
  // Compared as addresses: a view of other memory is the caller's bug, not a short file.
  auto at = reinterpret_cast<uintptr_t>(view.data()), base = reinterpret_cast<uintptr_t>(data_);
  if (view.empty()) return 0;
  if (at < base || at - base > size_ || view.size() > size_ - (at - base))
    throw Error(ErrorKind::kInvalidArgument, path_ + ": a byte range that is not part of the file was asked for");
  return at - base;
}

void MappedFile::AdviseSequential(uint64_t offset, uint64_t len) const {
  if (!owned_) return;
  Advise(data_, size_, offset, len, MADV_SEQUENTIAL);
  (void)posix_fadvise(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(len), POSIX_FADV_SEQUENTIAL);
}
void MappedFile::AdviseWillNeed(uint64_t offset, uint64_t len) const {
  if (owned_) Advise(data_, size_, offset, len, MADV_WILLNEED);
}
void MappedFile::Release(uint64_t offset, uint64_t len) const {
  if (owned_) Advise(data_, size_, offset, len, MADV_DONTNEED);
}

}  // namespace zckpt
