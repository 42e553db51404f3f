// common/pages.h and the page rounding of MappedFile's advice, run twice by meson: with the
// kernel's page, and with ZCKPT_TEST_PAGE_SIZE=65536 (a 64 KiB-page kernel's arithmetic, as on
// Grace machines, on this 4 KiB one).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "common/pages.h"
#include "test_util.h"

namespace zckpt {
namespace {

uint64_t Kernel() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

TEST(Pages, PageSizeIsTheKernelsOrTheOneATestAsksFor) {
  const char* env = std::getenv("ZCKPT_TEST_PAGE_SIZE");
  uint64_t want = env != nullptr ? std::strtoull(env, nullptr, 10) : Kernel();
  EXPECT_EQ(PageSize(), want);
  EXPECT_EQ(PageSize() % Kernel(), 0u);
  EXPECT_EQ(PageFloor(PageSize() + 1), PageSize());
  EXPECT_EQ(PageCeil(PageSize() + 1), 2 * PageSize());
  EXPECT_EQ(PageCeil(0), 0u);
}

TEST(Pages, ResidencyIsTheKernelsPagesOfTheRangeItself) {
  // Fresh anonymous memory is not resident; written, it is. A 5-byte range in the middle of the
  // mapping asks about its own kernel page only, whatever PageSize() says.
  const size_t bytes = 4 * Kernel();
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(m);
  EXPECT_EQ(AllPagesResident(p + Kernel() + 10, 5), std::optional<bool>(false));
  p[Kernel() + 12] = 1;
  EXPECT_EQ(AllPagesResident(p + Kernel() + 10, 5), std::optional<bool>(true));
  EXPECT_EQ(AllPagesResident(p, bytes), std::optional<bool>(false));
  std::memset(p, 1, bytes);
  EXPECT_EQ(AllPagesResident(p, bytes), std::optional<bool>(true));
  munmap(m, bytes);
}

TEST(Pages, ReleaseAtTheEndOfAFileStaysInsideItsMapping) {
  // A file of one kernel page and a bit maps two kernel pages; the next PageSize() bytes (as far
  // as a wrong rounding of the file's end could reach) hold an anonymous mapping of ours.
  // Releasing the file's tail must not reach it: a tail rounded up to a 64 KiB page on a 4 KiB
  // kernel would drop (zero) the neighbour's bytes. The neighbour is mapped first and the file
  // next, which the kernel places right below it when the gap the neighbour went to has room;
  // where it has none, both stay (filling that gap) and the next try goes lower.
  testing::TempDir dir;
  const std::string path = dir.File("file");
  std::vector<uint8_t> bytes(Kernel() + 100, 'x');
  testing::WriteFileBytes(path, bytes);
  const size_t neighbour = PageSize();
  std::vector<std::unique_ptr<MappedFile>> misplaced;
  std::vector<uint8_t*> regions;
  std::unique_ptr<MappedFile> f;
  uint8_t* after = nullptr;
  for (int attempt = 0; attempt < 64 && f == nullptr; ++attempt) {
    void* m = mmap(nullptr, neighbour, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    regions.push_back(static_cast<uint8_t*>(m));
    auto file = std::make_unique<MappedFile>(path);
    if (file->data() + 2 * Kernel() != m) {
      misplaced.push_back(std::move(file));
      continue;
    }
    f = std::move(file);
    after = static_cast<uint8_t*>(m);
  }
  ASSERT_NE(f, nullptr) << "the file was never mapped right below a neighbour";
  std::memset(after, 0x5a, neighbour);
  f->Release(0, f->size());
  f->AdviseWillNeed(Kernel(), 100);
  f->AdviseSequential(0, f->size());
  EXPECT_EQ(after[0], 0x5a) << "the release of the file's tail dropped the next mapping's pages";
  EXPECT_EQ(after[neighbour - 1], 0x5a);
  std::vector<uint8_t> back(bytes.size());
  f->ReadAt(0, back.size(), back.data());
  EXPECT_EQ(back, bytes);
  EXPECT_EQ(f->data()[Kernel() + 99], 'x');  // the mapping reads the file again after the release
  for (uint8_t* r : regions) munmap(r, neighbour);
}

}  // namespace
}  // namespace zckpt
