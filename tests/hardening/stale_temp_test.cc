// Stale temporaries (common/atomic_file.h, common/stale_temps.h): where a writer's data has a
// name before it is complete (the named fallback of filesystems without O_TMPFILE, or the instant
// between an O_TMPFILE's link and its rename), a writer that dies leaves its
// `.NAME.zckpt-tmp-PID-*` file; the next writer in the folder removes it, whatever its own
// destination, but never the temporary of a writer that is still alive, in this process or
// another, however old its file looks. Most cases force the named fallback
// (SetAtomicFileUseTmpfile(false)); the O_TMPFILE cases at the end need a filesystem with it.
//
// Writers in other processes are forked children (this suite starts no threads before forking),
// told what to do over pipes, and SIGKILLed where the test wants a dead writer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "hardening_util.h"
#include "test_util.h"

namespace zckpt::hardening {
namespace {

using testing::ListDir;
using testing::ReadFileBytes;
using testing::TempDir;

namespace fs = std::filesystem;

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Sets a file's (or a link's own) mtime `seconds` into the past: an old temporary without waiting
// for it to age.
void Age(const std::string& path, int seconds = 60) {
  struct timespec times[2] = {{0, UTIME_OMIT}, {std::time(nullptr) - seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path << ": " << std::strerror(errno);
}

std::vector<std::string> TempsOf(const std::string& dir, const std::string& dest_name) {
  std::vector<std::string> out;
  for (const std::string& e : ListDir(dir))
    if (IsTempOf(e, dest_name)) out.push_back(e);
  return out;
}

void WriteLine(int fd, const std::string& s) {
  std::string line = s + "\n";
  (void)!::write(fd, line.data(), line.size());
}

std::string ReadLine(int fd) {
  std::string s;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

// A writer in a forked child: creates an AtomicFile for `dest`, writes "partial", reports its
// temporary's path, then on each command line from the parent: "finish" writes "child" over and
// commits (exit 0); anything else (or EOF) exits 3 without committing. SIGKILL kills it mid-write.
// The named fallback unless a test says otherwise (restored after each test).
class NamedTemporaries : public ::testing::Test {
 protected:
  void SetUp() override { SetAtomicFileUseTmpfile(false); }
  void TearDown() override {
    SetAtomicFileUseTmpfile(true);
    SetAtomicFileBeforeRename(nullptr);
  }
};

int g_report_fd = -1;  // the child's pipe to the parent, for the before-rename hook

// In a child about to rename its linked O_TMPFILE: tell the parent the name, then wait to be
// killed (between the two steps of atomic_file.h).
void ReportAndHang(const std::string& temp_path) {
  WriteLine(g_report_fd, temp_path);
  for (;;) ::pause();
}

class ChildWriter {
 public:
  // hang_before_rename: the child commits at once and stops between link and rename, having
  // reported the temporary's name (for the parent to SIGKILL it there).
  explicit ChildWriter(const std::string& dest, bool hang_before_rename = false) {
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(to_child[1]);
      ::close(from_child[0]);
      int rc = 3;
      try {
        AtomicFile file(dest);
        file.Write("partial", 7);
        file.Write(std::string(2 << 20, 'x').data(), 2 << 20);  // past the buffer: on disk now
        if (hang_before_rename) {
          g_report_fd = from_child[1];
          SetAtomicFileBeforeRename(ReportAndHang);
          file.Commit();
        }
        WriteLine(from_child[1], file.temp_path());
        if (ReadLine(to_child[0]) == "finish") {
          file.Abort();
          AtomicFile done(dest);
          done.Write("child", 5);
          done.Commit();
          rc = 0;
        }
      } catch (...) {
        rc = 4;
      }
      ::_exit(rc);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    to_child_ = to_child[1];
    from_child_ = from_child[0];
    temp_path_ = ReadLine(from_child_);
  }
  ~ChildWriter() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait(pid_);
    }
    ::close(to_child_);
    ::close(from_child_);
  }
  const std::string& temp_path() const { return temp_path_; }
  int Kill() {
    ::kill(pid_, SIGKILL);
    int status = Wait(pid_);
    pid_ = -1;
    return status;
  }
  int Finish() {
    WriteLine(to_child_, "finish");
    int status = Wait(pid_);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string temp_path_;
};

// Starts a writer for `dest` in a child and SIGKILLs it mid-write; returns its leftover temporary.
std::string KilledWritersTemp(const std::string& dest) {
  ChildWriter child(dest);
  EXPECT_TRUE(fs::exists(child.temp_path())) << child.temp_path();
  EXPECT_EQ(child.Kill(), 128 + SIGKILL);
  return child.temp_path();
}

// The folder holds `name` alone (no temporary left), with `content`.
void ExpectOnly(const TempDir& dir, const std::string& name, const std::string& content) {
  EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{name});
  EXPECT_EQ(ReadFileBytes(dir.File(name)), Bytes(content));
}

void CommitBytes(const std::string& dest, const std::string& content) {
  AtomicFile file(dest);
  file.Write(content.data(), content.size());
  file.Commit();
}

TEST_F(NamedTemporaries, KilledWritersTemporaryIsRemovedByTheNextWrite) {
  TempDir dir;
  const std::string dest = dir.File("model.zckpt");
  const std::string leftover = KilledWritersTemp(dest);
  ASSERT_TRUE(IsTempOf(fs::path(leftover).filename(), "model.zckpt")) << leftover;
  // Dead writer: its temporary stays behind, nothing removes it on its own.
  ASSERT_EQ(TempsOf(dir.path(), "model.zckpt").size(), 1u);
  // Its pid is in the name and dead: no need to wait for it to age.

  AtomicFile next(dest);
  EXPECT_FALSE(fs::exists(leftover)) << "the dead writer's temporary survived a new write";
  EXPECT_EQ(TempsOf(dir.path(), "model.zckpt"), std::vector<std::string>{fs::path(next.temp_path()).filename()});
  next.Write("new", 3);
  next.Commit();
  ExpectOnly(dir, "model.zckpt", "new");
}

TEST_F(NamedTemporaries, FreshUnlockedLeftoverOfALiveOrUnknownPidIsKeptUntilItIsOld) {
  // Unlocked, younger than kStaleTempSeconds, and named by a live pid (this process: a writer
  // between its create and its flock) or by none (zckpt before pids): it stays; once old it goes.
  TempDir dir;
  const std::string dest = dir.File("a.pt");
  const std::string live = dir.File(TempName("a.pt", ::getpid(), 0x1234));
  const std::string no_pid = dir.File(".a.pt.zckpt-tmp-00000000deadbeef");
  testing::WriteFileBytes(live, Bytes("between create and flock"));
  testing::WriteFileBytes(no_pid, Bytes("an old zckpt's"));
  CommitBytes(dest, "one");
  EXPECT_TRUE(fs::exists(live)) << "a live pid's temporary seconds old was removed";
  EXPECT_TRUE(fs::exists(no_pid)) << "a temporary without pid, seconds old, was removed";
  Age(live, kStaleTempSeconds + 1);
  Age(no_pid, kStaleTempSeconds + 1);
  CommitBytes(dest, "two");
  EXPECT_FALSE(fs::exists(live));
  EXPECT_FALSE(fs::exists(no_pid));
  ExpectOnly(dir, "a.pt", "two");
}

TEST_F(NamedTemporaries, LiveWriterInAnotherProcessKeepsItsTemporary) {
  TempDir dir;
  const std::string dest = dir.File("model.zckpt");
  ChildWriter child(dest);
  const std::string live = child.temp_path();
  Age(live, 3600);  // a writer quiet for an hour (a slow source) is still alive

  // Several writes run while the child writes: each leaves the child's temporary alone.
  for (int i = 0; i < 3; ++i) {
    CommitBytes(dest, "parent" + std::to_string(i));
    ASSERT_TRUE(fs::exists(live)) << "a live writer's temporary was removed by write " << i;
  }
  EXPECT_EQ(ReadFileBytes(dest), Bytes("parent2"));
  EXPECT_EQ(ListDir(dir.path()), (std::vector<std::string>{fs::path(live).filename(), "model.zckpt"}));

  // The child goes on and commits: its data was intact, and it cleaned up after itself.
  EXPECT_EQ(child.Finish(), 0);
  ExpectOnly(dir, "model.zckpt", "child");
}

TEST_F(NamedTemporaries, LiveWriterInThisProcessKeepsItsTemporary) {
  // flock belongs to the open file, so a second writer in the same process cannot take the
  // first one's lock either.
  TempDir dir;
  const std::string dest = dir.File("x.zckpt");
  AtomicFile first(dest);
  first.Write("first", 5);
  Age(first.temp_path());
  CommitBytes(dest, "second");
  ASSERT_TRUE(fs::exists(first.temp_path()));
  first.Commit();
  ExpectOnly(dir, "x.zckpt", "first");
}

TEST_F(NamedTemporaries, EveryDeadWritersTemporaryInTheFolderAndNothingElseIsRemoved) {
  // A trainer killed while writing step_300 never writes step_300 again: the next writer in the
  // folder (step_400's) must clean up after it, so the sweep covers the folder, not one name.
  TempDir dir;
  const std::string dest = dir.File("m.zckpt");
  const std::string leftover = KilledWritersTemp(dest);
  const std::string other_leftover = KilledWritersTemp(dir.File("m.zckpt.bak"));
  // Look-alikes: a prefix of the name, a folder and a symlink named like temporaries, a file
  // without the random suffix or the leading dot.
  testing::WriteFileBytes(dir.File(".m.zckpt.zckpt-tmp-"), Bytes("no suffix"));
  testing::WriteFileBytes(dir.File("m.zckpt.zckpt-tmp-0123"), Bytes("no dot"));
  testing::WriteFileBytes(dir.File("target"), Bytes("symlink target"));
  fs::create_directory(dir.File(".m.zckpt.zckpt-tmp-dir"));
  fs::create_symlink(dir.File("target"), dir.File(".m.zckpt.zckpt-tmp-link"));
  for (const std::string& e : ListDir(dir.path())) Age(dir.File(e));
  std::vector<std::string> before = ListDir(dir.path());

  CommitBytes(dest, "m");
  std::vector<std::string> after = ListDir(dir.path());
  std::vector<std::string> expected;
  for (const std::string& e : before)
    if (e != fs::path(leftover).filename() && e != fs::path(other_leftover).filename()) expected.push_back(e);
  expected.push_back("m.zckpt");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(after, expected);
  EXPECT_EQ(ReadFileBytes(dir.File("target")), Bytes("symlink target"));
}

TEST_F(NamedTemporaries, ManyKilledWritersLeaveAtMostTheLastOnesTemporary) {
  // A trainer preempted again and again: each new writer's start sweeps what the killed one
  // before it left, so the folder never holds more than the last one's.
  TempDir dir;
  const std::string dest = dir.File("big.zckpt");
  for (int i = 0; i < 8; ++i) {
    const std::string leftover = KilledWritersTemp(dest);
    EXPECT_EQ(TempsOf(dir.path(), "big.zckpt"), std::vector<std::string>{fs::path(leftover).filename()}) << "kill " << i;
  }
  CommitBytes(dest, "done");
  EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{"big.zckpt"});
}

// O_TMPFILE (the default): the data has no name while it is written.
bool HasTmpfile(const std::string& dir) {
  AtomicFile probe(dir + "/probe");
  return probe.temp_path().empty();
}

TEST(UnnamedTemporaries, WriterKilledWhileWritingLeavesNothing) {
  TempDir dir;
  if (!HasTmpfile(dir.path())) GTEST_SKIP() << dir.path() << ": no O_TMPFILE on this filesystem";
  const std::string dest = dir.File("model.zckpt");
  CommitBytes(dest, "old");
  for (int i = 0; i < 4; ++i) {
    ChildWriter child(dest);
    EXPECT_EQ(child.temp_path(), "") << "an O_TMPFILE writer has a named temporary";
    EXPECT_EQ(child.Kill(), 128 + SIGKILL);
    ExpectOnly(dir, "model.zckpt", "old");  // nothing to sweep: the kernel freed it
  }
}

TEST(UnnamedTemporaries, WriterKilledBetweenLinkAndRenameIsSweptByTheNextWriter) {
  // linkat cannot replace a name: over an existing destination the finished O_TMPFILE is linked
  // to a temporary name, then renamed. SIGKILL in between leaves that name; the next writer in
  // the folder removes it at once (its writer's pid is dead), and the old destination is intact.
  TempDir dir;
  if (!HasTmpfile(dir.path())) GTEST_SKIP() << dir.path() << ": no O_TMPFILE on this filesystem";
  const std::string dest = dir.File("latest.zckpt");
  CommitBytes(dest, "old");
  std::string leftover;
  {
    ChildWriter child(dest, /*hang_before_rename=*/true);
    leftover = child.temp_path();
    ASSERT_TRUE(IsTempOf(fs::path(leftover).filename(), "latest.zckpt")) << leftover;
    // Alive and hanging there: its temporary is locked, so a writer now leaves it alone.
    CommitBytes(dir.File("other.zckpt"), "other");
    EXPECT_TRUE(fs::exists(leftover)) << "a live writer's linked temporary was removed";
    EXPECT_EQ(child.Kill(), 128 + SIGKILL);
  }
  EXPECT_TRUE(fs::exists(leftover));
  EXPECT_EQ(ReadFileBytes(dest), Bytes("old"));
  CommitBytes(dir.File("step_400.zckpt"), "next");  // another destination: the sweep covers the folder
  EXPECT_FALSE(fs::exists(leftover)) << "the killed writer's linked temporary survived the next writer";
  EXPECT_EQ(ListDir(dir.path()), (std::vector<std::string>{"latest.zckpt", "other.zckpt", "step_400.zckpt"}));
  EXPECT_EQ(ReadFileBytes(dest), Bytes("old"));
}

TEST(UnnamedTemporaries, NewDestinationIsLinkedStraightIntoPlace) {
  // No destination yet: linkat to it directly, so there is no instant with a second name.
  TempDir dir;
  if (!HasTmpfile(dir.path())) GTEST_SKIP() << dir.path() << ": no O_TMPFILE on this filesystem";
  SetAtomicFileBeforeRename([](const std::string& p) { ADD_FAILURE() << "renamed through " << p; });
  CommitBytes(dir.File("fresh.zckpt"), "fresh");
  SetAtomicFileBeforeRename(nullptr);
  ExpectOnly(dir, "fresh.zckpt", "fresh");
}

}  // namespace
}  // namespace zckpt::hardening
