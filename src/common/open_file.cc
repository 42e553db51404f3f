#include "common/open_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "zckpt/error.h"

namespace zckpt {

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

const char* FileTypeName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

namespace {

[[noreturn]] void ThrowErrno(const std::string& what, const std::string& path, int err) {
  throw Error(ErrorKind::kIo, what + " " + path + ": " + std::strerror(err));
}

[[noreturn]] void ThrowNotRegular(const std::string& path, mode_t mode) {
  throw Error(ErrorKind::kIo, path + ": not a regular file (" + std::string(FileTypeName(mode)) + ")");
}

}  // namespace

FileDescriptor OpenRegularFile(const std::string& path, struct stat* st) {
  if (::stat(path.c_str(), st) != 0) ThrowErrno("cannot open", path, errno);
  if (!S_ISREG(st->st_mode)) ThrowNotRegular(path, st->st_mode);
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) ThrowErrno("cannot open", path, errno);
  if (::fstat(fd.get(), st) != 0) ThrowErrno("cannot stat", path, errno);
  if (!S_ISREG(st->st_mode)) ThrowNotRegular(path, st->st_mode);  // swapped after the stat above
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) ThrowErrno("cannot open", path, errno);
  return fd;
}

}  // namespace zckpt
