// Writing a file so that the destination name only ever holds a complete file, and a writer
// killed at any moment leaves nothing behind.
//
// Where the filesystem has O_TMPFILE, data goes to an unnamed file in the destination's folder
// (same filesystem, so the final step is atomic): a writer killed while writing leaves no name at
// all, and the kernel frees the space. Commit() fsyncs it, then gives it the destination's name:
// linkat(2) straight to the destination when there is none yet (atomic, nothing in between), else
// linkat to a temporary name and rename(2) over the destination (linkat cannot replace a name).
// A writer killed between those two steps leaves that named temporary, still locked until the
// kernel reaps the writer; the next AtomicFile in the folder removes it (common/stale_temps.h).
// Elsewhere (no O_TMPFILE, or no /proc to link it through) the data goes to that named temporary
// from the start, created O_EXCL and locked at once, and the same sweep removes it when its writer
// dies. Either way the old destination stays intact until the rename, and the folder is fsynced
// after it. While it is written, the file's writeback is started behind the writer in windows of
// 32 MiB, and each window's pages are dropped from the page cache once it is on the disk: a
// write holds about two windows of the file in memory whatever its size, and Commit's fsync finds
// little left to write.
//
// Two writers of one destination: each one's result is whole, and the last rename wins (rename(2)
// has no "only if unchanged"). A writer that finds at its commit that the destination is no longer
// the file it saw when it began -- another writer committed while this one wrote, so this commit
// replaces a checkpoint that writer has just reported as written -- still commits (last rename
// wins), and says so: Commit() returns the note, and the commit-note handler gets it (default: a
// "zckpt: warning: ..." line on stderr, which the CLI and Python callers see). The writer that
// renamed first reported success for a file that was whole and in place when it did; that a later
// rename replaced it is the rule, said by the later writer.
//
// Only a regular file is ever replaced: a destination that is a directory, FIFO, socket or device
// node is refused (Error(kInvalidArgument), exit code 2 in the CLI) before anything is created,
// and again just before the rename. A symbolic link is refused too: renaming over it would
// replace the link itself with a regular file, silently cutting whatever pointed through it
// (write to the link's target instead).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/types.h>

#include "common/stale_temps.h"

namespace zckpt {

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

  // fsync, name it (above; the temporary still locked), fsync the directory. Returns the note
  // also given to the commit-note handler when another writer's commit raced this one, else "".
  std::string Commit();
  // Removes the temporary file now.
  void Abort();

  const std::string& destination() const { return destination_; }
  // The named temporary; "" while the data is in an unnamed O_TMPFILE.
  const std::string& temp_path() const { return temp_path_; }

 private:
  void CreateNamed();
  void FlushBuffer();
  void WriteAll(const char* p, size_t size);
  void StartWriteback();
  void LinkIntoPlace();
  std::string RaceNote() const;

  std::string destination_;
  std::string temp_path_;
  int fd_ = -1;
  bool unnamed_ = false;  // an O_TMPFILE, no name yet
  // What the destination was (lstat) when this writer began: dev/ino, or absent.
  bool dest_existed_ = false;
  dev_t dest_dev_ = 0;
  ino_t dest_ino_ = 0;
  uint64_t position_ = 0;
  // Bytes appended through write(2) (position_ less what buffer_ holds), the end of the range
  // whose writeback has been started, and the end of the range written and handed back to the
  // kernel (write-behind and drop-behind, atomic_file.cc); false once the filesystem refused.
  uint64_t appended_ = 0;
  uint64_t behind_ = 0;
  uint64_t dropped_ = 0;
  bool write_behind_ = true;
  bool done_ = false;
  // Small writes (records, padding) are gathered so the kernel sees large writes.
  std::string buffer_;
};

// Receives each commit's race note (see above); nullptr restores the default (stderr). Process-wide.
void SetCommitNoteHandler(void (*handler)(const std::string& note));

// Test hooks. false: never O_TMPFILE, every writer names its temporary from the start (the
// fallback of filesystems without it). `before_rename`: called by Commit once the temporary it is
// about to rename has its name (a test kills the writer there).
void SetAtomicFileUseTmpfile(bool use);
void SetAtomicFileBeforeRename(void (*before_rename)(const std::string& temp_path));

// Test hook: when set (>0), the Nth write(2) issued by any AtomicFile fails with EIO. Lets tests
// inject a write error without a full disk. 0 disables.
void SetAtomicFileFailAfterWrites(int n);

}  // namespace zckpt
