#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "zckpt/error.h"

namespace zckpt {

namespace {

[[noreturn]] void ThrowErrno(const std::string& what, const std::string& path) {
  throw Error(ErrorKind::kIo, what + " " + path + ": " + std::strerror(errno));
}

void Advise(const uint8_t* base, size_t size, uint64_t offset, uint64_t len, int advice) {
  if (base == nullptr || offset >= size || len == 0) return;
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t end = offset + len > size ? size : offset + len;
  uint64_t start = offset / page * page;
  // MADV_DONTNEED on a partial trailing page would drop bytes still needed; round the end down
  // for it, up for the read-ahead hints.
  uint64_t stop = advice == MADV_DONTNEED ? end / page * page : (end + page - 1) / page * page;
  if (advice == MADV_DONTNEED && end == size) stop = (end + page - 1) / page * page;
  if (stop <= start) return;
  (void)madvise(const_cast<uint8_t*>(base) + start, stop - start, advice);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path), owned_(true) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowErrno("cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    ThrowErrno("cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kIo, "not a regular file: " + path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int saved = errno;
      ::close(fd);
      errno = saved;
      ThrowErrno("cannot mmap", path);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::MappedFile(const void* data, size_t size, std::string name)
    : data_(static_cast<const uint8_t*>(data)), size_(size), path_(std::move(name)), owned_(false) {}

MappedFile::~MappedFile() {
  if (owned_ && data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::AdviseSequential(uint64_t offset, uint64_t len) const {
  if (owned_) Advise(data_, size_, offset, len, MADV_SEQUENTIAL);
}
void MappedFile::AdviseWillNeed(uint64_t offset, uint64_t len) const {
  if (owned_) Advise(data_, size_, offset, len, MADV_WILLNEED);
}
void MappedFile::Release(uint64_t offset, uint64_t len) const {
  if (owned_) Advise(data_, size_, offset, len, MADV_DONTNEED);
}

}  // namespace zckpt
