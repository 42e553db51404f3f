#include "common/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "common/open_file.h"
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

std::string TempPrefix(const std::string& destination) { return "." + BaseName(destination) + ".zckpt-tmp-"; }

// Takes the writer's lock on its temporary. A cleaner may hold it for an instant (it then sees a
// fresh file and lets go), hence a blocking lock. A filesystem without flock: no lock, and then
// no cleaner can take one either, so nothing there is ever removed.
void LockTemp(int fd) {
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
}

// Removes the destination's temporaries left by dead writers (see atomic_file.h). `own` is the
// caller's temporary (a name, skipped). Never throws.
void RemoveStaleTemps(const std::string& destination, const std::string& own) {
  const std::string dir = DirName(destination), prefix = TempPrefix(destination);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix && name != own) names.emplace_back(name);
  }
  const int dfd = ::dirfd(d);
  for (const std::string& name : names) {
    int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st, named;
    // Locked by nobody (its writer is gone), old enough, and the name still is this file (not
    // removed and re-created by someone else since we opened it).
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        std::time(nullptr) - st.st_mtime >= kStaleTempSeconds &&
        ::fstatat(dfd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 && named.st_ino == st.st_ino &&
        named.st_dev == st.st_dev) {
      (void)::unlinkat(dfd, name.c_str(), 0);
    }
    ::close(fd);  // drops the lock
  }
  ::closedir(d);
}

// Error(kInvalidArgument) unless the destination is absent or a regular file (atomic_file.h).
void CheckDestination(const std::string& destination) {
  struct stat st;
  if (::lstat(destination.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    ThrowIo("cannot stat destination", destination, errno);
  }
  if (S_ISREG(st.st_mode)) return;
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = ::readlink(destination.c_str(), target, sizeof target - 1);
    std::string to = n > 0 ? " to '" + std::string(target, static_cast<size_t>(n)) + "'" : "";
    throw Error(ErrorKind::kInvalidArgument,
                destination + ": the destination is a symbolic link" + to +
                    "; zckpt writes a new file and renames it into place, which would replace the link itself, so it "
                    "refuses: write to the link's target, or remove the link first");
  }
  throw Error(ErrorKind::kInvalidArgument, destination + ": the destination is not a regular file (" +
                                               FileTypeName(st.st_mode) +
                                               "); zckpt replaces only regular files and leaves this one untouched");
}

}  // namespace

void SetAtomicFileFailAfterWrites(int n) { g_fail_after.store(n); }

AtomicFile::AtomicFile(const std::string& destination) : destination_(destination) {
  CheckDestination(destination);  // before anything is created next to it
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
  LockTemp(fd_);
  RemoveStaleTemps(destination, BaseName(temp_path_));
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
  // close(2) reports late write errors (NFS), so it comes before the rename; the lock must stay
  // until after it (a cleaner would take an old-looking unlocked temporary). The lock belongs to
  // the open file description, which a duplicate keeps open.
  int lock_fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (lock_fd < 0) ThrowIo("cannot commit", destination_, errno);
  if (::close(fd_) != 0) {
    fd_ = lock_fd;
    ThrowIo("cannot close", destination_, errno);
  }
  fd_ = lock_fd;
  // Again: something other than a file may have appeared at the destination since the start.
  // (rename(2) has no "only over a regular file" flag; this narrows the window to the rename.)
  CheckDestination(destination_);
  if (::rename(temp_path_.c_str(), destination_.c_str()) != 0) ThrowIo("cannot rename into", destination_, errno);
  done_ = true;
  ::close(fd_);
  fd_ = -1;
  int dir = ::open(DirName(destination_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);  // best effort: some filesystems refuse fsync on directories
    ::close(dir);
  }
}

void AtomicFile::Abort() {
  if (done_) return;
  done_ = true;
  ::unlink(temp_path_.c_str());  // still locked: no cleaner races this
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void CopyFileAtomically(const std::string& from, const std::string& to) {
  MappedFile in(from);  // only its descriptor is read (ReadAt), the mapping stays untouched
  AtomicFile out(to);
  std::vector<uint8_t> piece;
  constexpr uint64_t kPiece = 4ull << 20;
  for (uint64_t off = 0; off < in.size(); off += kPiece) {
    uint64_t n = std::min<uint64_t>(kPiece, in.size() - off);
    piece.resize(n);
    in.ReadAt(off, n, piece.data());
    out.Write(piece.data(), n);
  }
  out.Commit();
}

}  // namespace zckpt
