// Opening a file to read it, without ever blocking on what the path turns out to be.
//
// open(2) of a FIFO blocks until a writer appears, and a read from a FIFO, terminal or socket
// blocks until input arrives, so a path a user passes (or one planted in a checkpoint folder)
// could hang `zckpt verify`/`load`/`export`/`convert` and `zckpt.load` forever; opening a device
// node can have effects of its own (a tape rewinds, a watchdog arms). Every reader of a file
// therefore goes through OpenRegularFile: stat(2) first (a path that is not a regular file is
// refused without being opened), then open with O_NONBLOCK | O_NOCTTY, fstat(2) of what was
// opened (the path may have been swapped in between), and only then O_NONBLOCK cleared.
#pragma once

#include <sys/stat.h>

#include <string>

namespace zckpt {

// Owns a file descriptor; closes it on destruction.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& o) noexcept : fd_(o.release()) {}
  FileDescriptor& operator=(FileDescriptor&& o) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// "a FIFO", "a directory", "a character device", ... for an st_mode that is not a regular file.
const char* FileTypeName(mode_t mode);

// Opens `path` read-only (O_CLOEXEC) as described above and fills *st from fstat of the opened
// file. Throws Error(kIo) naming the path: it does not exist or cannot be opened, or it is not a
// regular file ("PATH: not a regular file (a FIFO)").
FileDescriptor OpenRegularFile(const std::string& path, struct stat* st);

}  // namespace zckpt
