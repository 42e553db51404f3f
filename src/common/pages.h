// Memory pages: their size, the one home of it, and the residency question the loader asks.
//
// The page is the kernel's (sysconf(_SC_PAGESIZE)): 4 KiB on x86-64, 4, 16 or 64 KiB on aarch64
// (Grace machines often boot 64 KiB kernels). Every madvise/mincore range in zckpt is rounded to
// PageSize(), and no code assumes 4 KiB. The 4096 bytes of O_DIRECT (loader/plan.h
// kDirectIoAlign) and of the format's large_alignment are a block size, not a page size.
#pragma once

#include <cstdint>
#include <optional>

namespace zckpt {

// The page size: the kernel's; in a build with tests (ZCKPT_TEST_HOOKS), ZCKPT_TEST_PAGE_SIZE
// when it names a power of two that is a multiple of the kernel's, up to kMaxTestPageSize (so
// a 4 KiB kernel runs the page arithmetic of a 64 KiB one: every such multiple is a valid madvise
// boundary there too). Read once, at the first call.
uint64_t PageSize();
inline constexpr uint64_t kMaxTestPageSize = 1u << 20;

// Whether every page of [addr, addr + len) is resident: in memory for anonymous memory, in the
// page cache for a file's mapping. mincore reads the page tables and touches no page; it answers
// per kernel page, which is what the range is rounded out to (those pages hold the range's own
// bytes, so they are mapped whatever PageSize() says). nullopt where it cannot say.
std::optional<bool> AllPagesResident(const void* addr, uint64_t len);

// `offset` rounded down and up to PageSize().
uint64_t PageFloor(uint64_t offset);
uint64_t PageCeil(uint64_t offset);

}  // namespace zckpt
