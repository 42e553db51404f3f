#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "zckpt/error.h"

namespace zckpt {

namespace {

constexpr size_t kBufferBytes = 1 << 20;
std::atomic<int> g_fail_after{0};

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

[[noreturn]] void ThrowIo(const std::string& what, const std::string& path, int err) {
  throw Error(ErrorKind::kIo, what + " " + path + ": " + std::strerror(err));
}

}  // namespace

void SetAtomicFileFailAfterWrites(int n) { g_fail_after.store(n); }

AtomicFile::AtomicFile(const std::string& destination) : destination_(destination) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    char suffix[24];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
    temp_path_ = DirName(destination) + "/." + BaseName(destination) + ".zckpt-tmp-" + suffix;
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) ThrowIo("cannot create temporary file for", destination, errno);
  }
  if (fd_ < 0) ThrowIo("cannot create temporary file for", destination, EEXIST);
  buffer_.reserve(kBufferBytes);
}

AtomicFile::~AtomicFile() {
  if (!done_) Abort();
}

void AtomicFile::WriteAll(const char* p, size_t left) {
  while (left > 0) {
    ssize_t n;
    int fail = g_fail_after.load();
    if (fail > 0 && g_fail_after.fetch_sub(1) == 1) {
      n = -1;
      errno = EIO;
    } else {
      n = ::write(fd_, p, left);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      buffer_.clear();
      ThrowIo("cannot write", destination_, err);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void AtomicFile::FlushBuffer() {
  WriteAll(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFile::Write(const void* data, size_t size) {
  if (done_) throw Error(ErrorKind::kInvalidArgument, "write after commit/abort: " + destination_);
  const char* p = static_cast<const char*>(data);
  position_ += size;
  if (buffer_.size() + size > kBufferBytes) FlushBuffer();
  if (size < kBufferBytes) {
    buffer_.append(p, size);
  } else {
    WriteAll(p, size);  // large payloads go straight to the kernel, no copy through the buffer
  }
}

void AtomicFile::WriteZeros(uint64_t count) {
  static const char zeros[4096] = {};
  while (count > 0) {
    size_t n = count < sizeof zeros ? static_cast<size_t>(count) : sizeof zeros;
    Write(zeros, n);
    count -= n;
  }
}

void AtomicFile::Commit() {
  if (done_) throw Error(ErrorKind::kInvalidArgument, "commit after commit/abort: " + destination_);
  FlushBuffer();
  if (::fsync(fd_) != 0) ThrowIo("cannot fsync", destination_, errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    ThrowIo("cannot close", destination_, errno);
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), destination_.c_str()) != 0) ThrowIo("cannot rename into", destination_, errno);
  done_ = true;
  int dir = ::open(DirName(destination_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);  // best effort: some filesystems refuse fsync on directories
    ::close(dir);
  }
}

void AtomicFile::Abort() {
  if (done_) return;
  done_ = true;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
}

}  // namespace zckpt
void AtomicFile::WriteAt(uint64_t offset, const void* data, size_t size) {
  if (done_) throw Error(ErrorKind::kInvalidArgument, "write after commit/abort: " + destination_);
  if (offset > position_ || size > position_ - offset)
    throw Error(ErrorKind::kInvalidArgument, "WriteAt past the end written: " + destination_);
  FlushBuffer();  // the range may still be in the buffer
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < size;) {
    ssize_t n = ::pwrite(fd_, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ThrowIo("cannot write", destination_, n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
}

