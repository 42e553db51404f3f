// Paths that are not regular files (issue 11, items 6 and 9): reading one (a FIFO, a directory)
// is refused at once, never blocks; writing to one (a FIFO, a directory, a symbolic link, a
// device node) is refused before anything is created, and the thing is left exactly as it was.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/error.h"

namespace zckpt::hardening {
namespace {

using testing::TempDir;

// Runs `open` on a FIFO; if it has not returned after a few seconds (it blocked), a writer opens
// the FIFO to release it and the test fails. Returns the error `open` threw.
Error ThrowsOnFifo(const std::string& fifo, const std::function<void()>& open) {
  std::atomic<bool> returned{false};
  std::thread rescue([&] {
    for (int i = 0; i < 500 && !returned; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!returned) {
      ADD_FAILURE() << "opening the FIFO blocked";
      int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  });
  Error caught(ErrorKind::kCancelled, "did not throw");
  try {
    open();
  } catch (const Error& e) {
    caught = e;
  }
  returned = true;
  rescue.join();
  return caught;
}

TEST(SpecialFiles, ReadingAFifoIsRefusedWithoutBlocking) {
  TempDir dir;
  std::string fifo = dir.File("pipe.zckpt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (int which = 0; which < 2; ++which) {
    Error e = ThrowsOnFifo(fifo, [&] {
      if (which == 0) (void)Container::Open(fifo);
      else MappedFile m(fifo);
    });
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    EXPECT_EQ(std::string(e.what()), fifo + ": not a regular file (a FIFO)");
  }
  struct stat st;
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(SpecialFiles, ReadingADirectoryIsRefused) {
  TempDir dir;
  try {
    (void)Container::Open(dir.path());
    ADD_FAILURE() << "opened a directory";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir.path() + ": not a regular file (a directory)");
  }
}

// A destination of each kind, and how to tell it is exactly as before.
struct Destination {
  std::string name, path;
  std::function<bool()> unchanged;
};

std::vector<Destination> MakeDestinations(const TempDir& dir) {
  std::vector<Destination> out;
  const std::string target = dir.File("precious");
  testing::WriteFileBytes(target, {'k', 'e', 'e', 'p'});
  auto stat_of = [](const std::string& p) {
    struct stat st = {};
    ::lstat(p.c_str(), &st);
    return st;
  };
  std::string fifo = dir.File("fifo.out");
  EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  out.push_back({"a FIFO", fifo, [=] { return S_ISFIFO(stat_of(fifo).st_mode); }});
  std::string link = dir.File("link.out");
  EXPECT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  out.push_back({"a symbolic link", link, [=] {
                   char buf[4096];
                   ssize_t n = ::readlink(link.c_str(), buf, sizeof buf);
                   return n > 0 && std::string(buf, static_cast<size_t>(n)) == target &&
                          testing::ReadFileBytes(target) == std::vector<uint8_t>{'k', 'e', 'e', 'p'};
                 }});
  std::string dangling = dir.File("dangling.out"), missing = dir.File("missing");
  EXPECT_EQ(::symlink(missing.c_str(), dangling.c_str()), 0);
  out.push_back({"a dangling symbolic link", dangling,
                 [=] { return S_ISLNK(stat_of(dangling).st_mode) && !testing::FileExists(missing); }});
  std::string sub = dir.File("dir.out");
  EXPECT_EQ(::mkdir(sub.c_str(), 0700), 0);
  out.push_back({"a directory", sub, [=] { return S_ISDIR(stat_of(sub).st_mode) && testing::ListDir(sub).empty(); }});
  if (::geteuid() == 0) {  // a node like /dev/null, made here where replacing it would harm nothing
    std::string null = dir.File("null.out");
    EXPECT_EQ(::mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
    out.push_back({"a character device", null, [=] {
                     struct stat st = stat_of(null);
                     return S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
                   }});
  }
  return out;
}

TEST(SpecialFiles, WritingOverANonRegularFileIsRefusedAndLeavesItAlone) {
  TempDir dir;
  for (const Destination& d : MakeDestinations(dir)) {
    SCOPED_TRACE(d.name);
    std::vector<std::string> before = testing::ListDir(dir.path());
    for (int writer = 0; writer < 2; ++writer) {
      try {
        if (writer == 0) {
          AtomicFile f(d.path);
          f.Write("x", 1);
          f.Commit();
        } else {
          ContainerWriter w(d.path);
          w.Commit();
        }
        ADD_FAILURE() << "wrote over " << d.name;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
        std::string m = e.what();
        EXPECT_EQ(m.rfind(d.path + ": the destination is ", 0), 0u) << m;
      }
      EXPECT_TRUE(d.unchanged());
      EXPECT_EQ(testing::ListDir(dir.path()), before) << "something was created next to it";
    }
  }
}

// Something other than a file appears at the destination while the writer works: the commit
// refuses it too (checked again right before the rename), and the temporary goes away.
TEST(SpecialFiles, ANonRegularFileAppearingBeforeTheCommitIsLeftAlone) {
  TempDir dir;
  std::string dest = dir.File("out.bin");
  {
    AtomicFile f(dest);
    f.Write("data", 4);
    ASSERT_EQ(::mkfifo(dest.c_str(), 0600), 0);
    EXPECT_THROW(f.Commit(), Error);
  }
  struct stat st;
  ASSERT_EQ(::lstat(dest.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(testing::ListDir(dir.path()), std::vector<std::string>{"out.bin"});
}

TEST(SpecialFiles, ARegularDestinationIsStillReplaced) {
  TempDir dir;
  std::string dest = dir.File("out.bin");
  testing::WriteFileBytes(dest, {'o', 'l', 'd'});
  AtomicFile f(dest);
  f.Write("new", 3);
  f.Commit();
  EXPECT_EQ(testing::ReadFileBytes(dest), (std::vector<uint8_t>{'n', 'e', 'w'}));
}

}  // namespace
}  // namespace zckpt::hardening
