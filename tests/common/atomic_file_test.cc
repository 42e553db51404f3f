// AtomicFile's drop-behind (common/atomic_file.cc, kWriteBehindBytes): a file written through it
// leaves the page cache behind the writer, all but its last two windows, and reads back whole.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "test_util.h"

namespace zckpt {
namespace {

using testing::ReadFileBytes;
using testing::TempDir;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kWindow = 32 * kMiB;  // atomic_file.cc's kWriteBehindBytes

// Pages of [offset, offset + length) of `path` that are in the page cache.
uint64_t ResidentPages(const std::string& path, uint64_t offset, uint64_t length) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
  ::close(fd);
  EXPECT_NE(map, MAP_FAILED);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((length + page - 1) / page);
  EXPECT_EQ(::mincore(map, length, in.data()), 0);
  ::munmap(map, length);
  uint64_t resident = 0;
  for (unsigned char c : in) resident += c & 1;
  return resident;
}

TEST(AtomicFile, WrittenWindowsLeaveThePageCacheAndTheFileReadsBackWhole) {
  TempDir dir;
  struct statfs fs;
  ASSERT_EQ(::statfs(dir.path().c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC)
    GTEST_SKIP() << dir.path() << " is on tmpfs, whose pages are the file itself: nothing to drop there";
  const std::string path = dir.File("big");
  const uint64_t total = 5 * kWindow;
  std::vector<uint8_t> piece(kMiB);
  {
    AtomicFile file(path);
    for (uint64_t off = 0; off < total; off += piece.size()) {
      for (size_t i = 0; i < piece.size(); i += 4096) piece[i] = static_cast<uint8_t>((off + i) / 4096 * 7);
      file.Write(piece.data(), piece.size());
    }
    file.Commit();
  }
  // Windows are dropped once the window after them has started: all but the last two here.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t dropped = total - 2 * kWindow;
  EXPECT_LE(ResidentPages(path, 0, dropped), dropped / page / 100) << "of " << dropped / page << " pages";
  std::vector<uint8_t> back = ReadFileBytes(path);
  ASSERT_EQ(back.size(), total);
  for (uint64_t i = 0; i < total; i += 4096)
    ASSERT_EQ(back[i], static_cast<uint8_t>(i / 4096 * 7)) << "byte " << i;
}

}  // namespace
}  // namespace zckpt
