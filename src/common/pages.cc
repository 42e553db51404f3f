#include "common/pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace zckpt {

namespace {

uint64_t KernelPageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

uint64_t ResolvePageSize() {
  const uint64_t kernel = KernelPageSize();
#ifdef ZCKPT_TEST_HOOKS
  if (const char* env = std::getenv("ZCKPT_TEST_PAGE_SIZE"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    uint64_t v = std::strtoull(env, &end, 10);
    // Anything else is ignored rather than honoured: a page that is not a multiple of the kernel's
    // would make madvise fail (or reach pages outside the range), which no test wants.
    if (*end == '\0' && v >= kernel && v <= kMaxTestPageSize && (v & (v - 1)) == 0 && v % kernel == 0) return v;
  }
#endif
  return kernel;
}

}  // namespace

uint64_t PageSize() {
  static const uint64_t page = ResolvePageSize();
  return page;
}

uint64_t PageFloor(uint64_t offset) { return offset / PageSize() * PageSize(); }
uint64_t PageCeil(uint64_t offset) { return (offset + PageSize() - 1) / PageSize() * PageSize(); }

std::optional<bool> AllPagesResident(const void* addr, uint64_t len) {
  const uintptr_t page = KernelPageSize();
  uintptr_t begin = reinterpret_cast<uintptr_t>(addr) / page * page;
  uintptr_t end = (reinterpret_cast<uintptr_t>(addr) + len + page - 1) / page * page;
  thread_local std::vector<unsigned char> resident;
  resident.resize((end - begin) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, resident.data()) != 0) return std::nullopt;
  return std::all_of(resident.begin(), resident.end(), [](unsigned char v) { return (v & 1) != 0; });
}

}  // namespace zckpt
