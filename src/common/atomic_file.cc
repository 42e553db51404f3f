#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <random>
#include <vector>

#include "common/mapped_file.h"
#include "common/open_file.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

constexpr size_t kBufferBytes = 1 << 20;
// Write-behind and drop-behind. Once this many bytes have gone to write(2) since the last window,
// their writeback is started (sync_file_range SYNC_FILE_RANGE_WRITE, which does not wait), and
// the window before it, whose writeback has had a window's time to run, is waited for and its
// pages handed back to the kernel (POSIX_FADV_DONTNEED). So a write holds about two windows of
// the file in the page cache whatever its size, the pages it frees are the ones its next writes
// get, and Commit's fsync finds at most two windows left to write.
// Why not leave the file to the page cache: a replacement is written beside the destination it
// replaces, so without drop-behind it needs as many fresh pages as it has bytes while the old
// file's stay cached until the rename (a write that truncates in place reuses the old file's
// pages at once). Fresh pages are what costs: on the project's VM (Firecracker, free-page
// reporting) touching 1 GiB of pages the kernel has not used lately takes 0.5-2.7 s, as much as
// or more than writing that GiB to disk. A checkpoint just written is seldom read back soon; its
// reader then reads it from disk, and the trainer's own cached data is not pushed out for it.
// Measured: docs/benchmarks.md#saving-issue-46 (tools/bench/bench_save_floor.py).
constexpr uint64_t kWriteBehindBytes = 32ull << 20;
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

// Takes the writer's lock on its temporary. A sweeper may hold it for an instant (it then sees a
// live or fresh file and lets go), hence a blocking lock. A filesystem without flock: no lock,
// and then no sweeper can take one either, so nothing there is ever removed.
void LockTemp(int fd) {
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
}

std::atomic<bool> g_use_tmpfile{true};
std::atomic<void (*)(const std::string&)> g_before_rename{nullptr};
std::atomic<void (*)(const std::string&)> g_note_handler{nullptr};

// No thread_local engine: libzckpt_save is dlopened by Python, where static TLS is scarce.
unsigned long long RandomSuffix() {
  std::random_device rd;
  return (static_cast<unsigned long long>(rd()) << 32) ^ rd();
}

std::string ProcFdPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

// An unnamed file in `dir` that can later be linked through /proc/self/fd (the one way linkat
// names an O_TMPFILE without CAP_DAC_READ_SEARCH); -1 where either is missing.
int OpenUnnamed(const std::string& dir) {
  if (!g_use_tmpfile.load()) return -1;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return -1;  // EOPNOTSUPP, EISDIR (old kernel), ...: the named fallback says why if it fails too
  char target[64];
  if (::readlink(ProcFdPath(fd).c_str(), target, sizeof target) < 0) {
    ::close(fd);
    return -1;
  }
  return fd;
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

void SetAtomicFileUseTmpfile(bool use) { g_use_tmpfile.store(use); }
void SetAtomicFileBeforeRename(void (*before_rename)(const std::string&)) { g_before_rename.store(before_rename); }
void SetCommitNoteHandler(void (*handler)(const std::string&)) { g_note_handler.store(handler); }

AtomicFile::AtomicFile(const std::string& destination) : destination_(destination) {
  CheckDestination(destination);  // before anything is created next to it
  fd_ = OpenUnnamed(DirName(destination));
  unnamed_ = fd_ >= 0;
  if (!unnamed_) CreateNamed();
  LockTemp(fd_);  // before an O_TMPFILE ever has a name; right after the named create
  // Seen after this writer exists, so a commit that lands from now on is one Commit() notices.
  struct stat st;
  if (::lstat(destination.c_str(), &st) == 0) {
    dest_existed_ = true;
    dest_dev_ = st.st_dev;
    dest_ino_ = st.st_ino;
  }
  RemoveStaleTemps(DirName(destination), BaseName(temp_path_));
  buffer_.reserve(kBufferBytes);
}

void AtomicFile::CreateNamed() {
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    temp_path_ = DirName(destination_) + "/" + TempName(BaseName(destination_), ::getpid(), RandomSuffix());
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) ThrowIo("cannot create temporary file for", destination_, errno);
  }
  if (fd_ < 0) ThrowIo("cannot create temporary file for", destination_, EEXIST);
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
    appended_ += static_cast<uint64_t>(n);
  }
  if (appended_ - behind_ >= kWriteBehindBytes) StartWriteback();
}

// Write-behind and drop-behind (kWriteBehindBytes). A write error either call reports fails the
// write here: the wait consumes the error it reports (a later fsync of this file would not see
// it again). A filesystem that refuses the calls (EINVAL, ESPIPE, ENOSYS) gets neither from then
// on, and Commit's fsync writes it all.
void AtomicFile::StartWriteback() {
  if (!write_behind_) return;
  const auto sync_range = [this](uint64_t from, uint64_t to, unsigned flags) {
    if (::sync_file_range(fd_, static_cast<off_t>(from), static_cast<off_t>(to - from), flags) == 0) return true;
    if (errno == EIO || errno == ENOSPC || errno == EDQUOT) ThrowIo("cannot write", destination_, errno);
    write_behind_ = false;
    return false;
  };
  if (!sync_range(behind_, appended_, SYNC_FILE_RANGE_WRITE)) return;
  if (dropped_ < behind_) {
    if (!sync_range(dropped_, behind_,
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER))
      return;
    (void)::posix_fadvise(fd_, static_cast<off_t>(dropped_), static_cast<off_t>(behind_ - dropped_),
                          POSIX_FADV_DONTNEED);
    dropped_ = behind_;
  }
  behind_ = appended_;
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

// The race note (atomic_file.h): "" while the destination still is what this writer saw when it
// began (the same file, or none).
std::string AtomicFile::RaceNote() const {
  struct stat now;
  const bool exists = ::lstat(destination_.c_str(), &now) == 0;
  if (exists == dest_existed_ && (!exists || (now.st_dev == dest_dev_ && now.st_ino == dest_ino_))) return "";
  if (!exists) return destination_ + ": removed while this write ran; this write puts it back";
  return destination_ + (dest_existed_ ? ": replaced" : ": created") +
         " by another writer while this write ran; this write replaces that file (last rename wins)";
}

// Gives the finished file the destination's name (atomic_file.h): an O_TMPFILE goes straight to
// a destination that does not exist yet, or through a temporary name; a named temporary is
// renamed.
void AtomicFile::LinkIntoPlace() {
  if (unnamed_) {
    const std::string proc = ProcFdPath(fd_);
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, destination_.c_str(), AT_SYMLINK_FOLLOW) == 0) return;
    if (errno != EEXIST) ThrowIo("cannot link into", destination_, errno);
    for (int attempt = 0; attempt < 16 && temp_path_.empty(); ++attempt) {
      std::string name = DirName(destination_) + "/" + TempName(BaseName(destination_), ::getpid(), RandomSuffix());
      if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) temp_path_ = name;
      else if (errno != EEXIST) ThrowIo("cannot link temporary file for", destination_, errno);
    }
    if (temp_path_.empty()) ThrowIo("cannot link temporary file for", destination_, EEXIST);
    unnamed_ = false;  // from here on Abort unlinks the name
  }
  if (auto hook = g_before_rename.load()) hook(temp_path_);
  if (::rename(temp_path_.c_str(), destination_.c_str()) != 0) ThrowIo("cannot rename into", destination_, errno);
}

std::string AtomicFile::Commit() {
  if (done_) throw Error(ErrorKind::kInvalidArgument, "commit after commit/abort: " + destination_);
  FlushBuffer();
  if (::fsync(fd_) != 0) ThrowIo("cannot fsync", destination_, errno);
  // close(2) reports late write errors (NFS), so it comes before the rename; the lock must stay
  // until after it (a sweeper would take an unlocked temporary of a dead-looking writer). The lock
  // belongs to the open file description, which a duplicate keeps open (and an O_TMPFILE is
  // linked through it).
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
  const std::string note = RaceNote();
  LinkIntoPlace();
  done_ = true;
  ::close(fd_);
  fd_ = -1;
  int dir = ::open(DirName(destination_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);  // best effort: some filesystems refuse fsync on directories
    ::close(dir);
  }
  if (!note.empty()) {
    if (auto handler = g_note_handler.load()) handler(note);
    else std::fprintf(stderr, "zckpt: warning: %s\n", note.c_str());
  }
  return note;
}

void AtomicFile::Abort() {
  if (done_) return;
  done_ = true;
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());  // still locked: no sweeper races this
  if (fd_ >= 0) ::close(fd_);  // an O_TMPFILE without a name vanishes here
  fd_ = -1;
}

}  // namespace zckpt
