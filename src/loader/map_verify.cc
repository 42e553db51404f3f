#include "loader/map_verify.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "common/fault_guard.h"
#include "common/mapped_file.h"
#include "common/pages.h"
#include "format/chunk_check.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older kernels say EINVAL and pages fault as hashed
#endif

namespace zckpt::loader {

// Each chunk's pages are first mapped in with MADV_POPULATE_READ, one call instead of a fault
// per few pages (advice only: where it fails, the hash faults the pages in itself). The mapping
// is the file's, and another process may truncate the file at any moment, so the hash reads it
// under the SIGBUS guard: a page that is gone (however the truncation falls between populating
// and hashing) ends the check with Error(kIo), one path for every case.
void VerifyMapped(const Container& c, const uint8_t* base, const std::vector<uint64_t>& chunks, unsigned threads) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
    try {
      format::internal::ChunkChecker checker;
      for (size_t k; !failed.load(std::memory_order_relaxed) && (k = next.fetch_add(1)) < chunks.size();) {
        format::ChunkRecord r = c.chunk(chunks[k]);
        const uint8_t* p = base + r.offset;
        // From the chunk's first page, counted from the mapping's page-aligned start (so never
        // before it); the kernel rounds the length up to its own page, inside the mapping.
        const uint8_t* first_page = base + PageFloor(r.offset);
        (void)madvise(const_cast<uint8_t*>(first_page), static_cast<size_t>(p + r.stored_bytes - first_page),
                      MADV_POPULATE_READ);
        checker.Begin(r);
        auto feed = [&] { checker.Feed(p, r.stored_bytes); };  // a raw chunk: hashing only, guard-safe
        if (!Guarded(p, r.stored_bytes, feed))
          throw Error(ErrorKind::kIo, FileShrankMessage(c.path(), r.offset, r.offset + r.stored_bytes) + " (checking " +
                                          c.DescribeChunk(chunks[k]) + ")");
        if (std::optional<format::internal::ChunkFault> fault = checker.Finish())
          throw c.ChunkError(ErrorKind::kCorrupt, chunks[k], fault->Describe());
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  threads = static_cast<unsigned>(std::clamp<size_t>(threads, 1, std::max<size_t>(chunks.size(), 1)));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace zckpt::loader
