// Writing a file so that the destination name only ever holds a complete file.
//
// Data goes to a temporary file in the destination's directory (same filesystem, so rename is
// atomic); Commit() fsyncs it, renames it over the destination and fsyncs the directory.
// Destroying an uncommitted AtomicFile removes the temporary file. A process killed at any
// point therefore leaves either the old destination or the new one, plus at worst a stale
// `.NAME.zckpt-tmp-*` temporary.
//
// Only a regular file is ever replaced: a destination that is a directory, FIFO, socket or device
// node is refused (Error(kInvalidArgument), exit code 2 in the CLI) before anything is created,
// and again just before the rename. A symbolic link is refused too: renaming over it would
// replace the link itself with a regular file, silently cutting whatever pointed through it
// (write to the link's target instead).
//
// Stale temporaries are removed by the next AtomicFile for the same destination, without ever
// touching a live writer's: every writer holds an exclusive flock(2) on its temporary for its
// whole life (taken right after the O_CREAT|O_EXCL create, kept until after the rename or
// unlink), and the kernel drops it when the writer dies, SIGKILL included. A new writer removes
// the destination's other `.NAME.zckpt-tmp-*` regular files whose lock it can take without
// waiting (LOCK_NB) and whose mtime is at least kStaleTempSeconds old; the age test covers the
// instant between another writer's create and its flock. Best effort: a temporary it cannot
// open, lock or remove (other owner, a filesystem without flock) is left alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zckpt {

// How old (mtime, seconds) an unlocked temporary must be before a new writer removes it.
inline constexpr int kStaleTempSeconds = 5;

class AtomicFile {
 public:
  // Error(kInvalidArgument) naming the destination when it exists and is not a regular file
  // (a symbolic link included); Error(kIo) when the temporary cannot be created.
  explicit AtomicFile(const std::string& destination);
  ~AtomicFile();  // aborts (unlinks the temporary) unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes at the current end. Throws Error(kIo) naming the destination on failure
  // (ENOSPC included), after which the only valid calls are Abort() or destruction.
  void Write(const void* data, size_t size);
  // Appends `count` zero bytes.
  void WriteZeros(uint64_t count);
  // Overwrites bytes already written at [offset, offset + size) (a header known only at the end);
  // the range must end at or before position(). Errors as Write.
  void WriteAt(uint64_t offset, const void* data, size_t size);
  uint64_t position() const { return position_; }

  // fsync, rename over the destination (the temporary still locked), fsync the directory.
  void Commit();
  // Removes the temporary file now.
  void Abort();

  const std::string& destination() const { return destination_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void FlushBuffer();
  void WriteAll(const char* p, size_t size);

  std::string destination_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t position_ = 0;
  bool done_ = false;
  // Small writes (records, padding) are gathered so the kernel sees large writes.
  std::string buffer_;
};

// Copies the regular file `from` (OpenRegularFile: a FIFO or device is refused, never read) to
// `to` through an AtomicFile, in pieces read with pread: a source that shrinks meanwhile is
// Error(kIo) naming it, and nothing appears at `to`.
void CopyFileAtomically(const std::string& from, const std::string& to);

// Test hook: when set (>0), the Nth write(2) issued by any AtomicFile fails with EIO. Lets tests
// inject a write error without a full disk. 0 disables.
void SetAtomicFileFailAfterWrites(int n);

}  // namespace zckpt
