#include "loader/chunk_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <new>
#include <optional>
#include <vector>

#include "common/byte_source.h"
#include "common/fault_guard.h"
#include "common/mapped_file.h"
#include "common/pages.h"
#include "format/chunk_check.h"
#include "format/container_file.h"
#include "loader/plan.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::loader {

using format::internal::ContainerFile;

namespace {

// Some filesystems accept O_DIRECT at open and refuse the first read (or refuse at open, like
// tmpfs): try one aligned block before trusting it.
bool DirectReadWorks(int fd) {
  void* buf = nullptr;
  if (posix_memalign(&buf, kDirectIoAlign, kDirectIoAlign) != 0) return false;
  ssize_t n = pread(fd, buf, kDirectIoAlign, 0);
  std::free(buf);
  return n >= 0;
}

// An O_DIRECT descriptor of the file open as `fd` (owned by the caller), or -1 where there is none
// or the filesystem refuses direct reads. O_DIRECT needs a descriptor of its own (the flag belongs
// to the open file description); /proc/self/fd reopens the same inode, checked, never the path.
int ReopenDirect(int fd) {
  if (fd < 0) return -1;
  int direct = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NOCTTY);
  struct stat a, b;
  if (direct >= 0 && (fstat(direct, &a) != 0 || fstat(fd, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev ||
                      !DirectReadWorks(direct))) {
    ::close(direct);
    direct = -1;
  }
  return direct;
}

}  // namespace

ChunkReader::ChunkReader(const Container& c, ReadMethod method, bool verify, TimeSplit& split,
                         bool direct_when_uncached)
    : c_(c), method_(method), verify_(verify), split_(split) {
  if (ContainerFile::Of(c_).remote()) {
    // An object: no mapping, no descriptor; every chunk is one ranged GET (Container::ReadChunk,
    // which fetches a chunk failing its checksum again), each reader thread a connection.
    method_ = ReadMethod::kPread;
    remote_ = true;
    return;
  }
  if (method_ == ReadMethod::kMmap) {
    ContainerFile::Of(c_).AdviseSequential(0, c_.file_bytes());
    return;
  }
  // The container's own descriptor: the file whose index was validated, whatever the path names
  // by now (reopening the path could read another file, or block on a FIFO swapped in).
  fd_ = ContainerFile::Of(c_).fd();
  if (fd_ < 0) throw Error(ErrorKind::kInvalidArgument, c_.path() + ": a container opened from memory has no file to read");
  if (method_ == ReadMethod::kDirect) {
    o_direct_fd_ = ReopenDirect(fd_);
    if (o_direct_fd_ >= 0) {
      fd_ = o_direct_fd_;
    } else {
      method_ = ReadMethod::kPread;
      return;  // the filesystem refuses O_DIRECT: no uncached reads either
    }
  }
  if (method_ == ReadMethod::kPread && direct_when_uncached) o_direct_fd_ = ReopenDirect(fd_);
}

ChunkReader::~ChunkReader() {
  if (o_direct_fd_ >= 0) ::close(o_direct_fd_);
}

uint64_t ChunkReader::ReadFile(uint64_t offset, uint64_t len, uint8_t* dst) const {
  TimeSplit::Scope timed(split_, TimeSplit::kRead);
  uint64_t size = c_.file_bytes();
  if (method_ == ReadMethod::kMmap) {
    uint64_t n = offset >= size ? 0 : std::min(len, size - offset);
    // The mapping is shared with whoever else has the file: a page past a truncation raises
    // SIGBUS, which GuardedCopy turns into this error. (Bytes rewritten meanwhile land in dst and
    // are hashed there, as with pread.)
    if (!GuardedCopy(dst, ContainerFile::Data(c_) + offset, n)) throw Error(ErrorKind::kIo, FileShrankMessage(c_.path(), offset, offset + n));
    // Drop what was just copied so the mapping's resident pages stay bounded by what is in flight.
    ContainerFile::Of(c_).Release(offset, n);
    return n;
  }
  return Pread(fd_, offset, len, dst);
}

uint64_t ChunkReader::Pread(int fd, uint64_t offset, uint64_t len, uint8_t* dst) const {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, dst + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::kIo, "cannot read " + c_.path() + " at " + std::to_string(offset + done) +
                                      (fd == o_direct_fd_ ? " (O_DIRECT): " : ": ") + std::strerror(errno));
    }
    if (n == 0) break;  // end of file (an O_DIRECT span rounded past it, or a file that shrank)
    done += static_cast<uint64_t>(n);
  }
  return done;
}

namespace {

// The chunk checker fed each needed chunk of a span in file order, as pieces of the span arrive.
class SpanChecker {
 public:
  SpanChecker(const Container& c, const Destinations& d, uint64_t begin, uint64_t first, uint64_t last, bool verify,
              TimeSplit& split)
      : c_(c), d_(d), begin_(begin), next_(first), last_(last), verify_(verify), split_(split) {
    Advance();
  }

  // Span bytes [0, upto) are now in `dst`.
  void Feed(const uint8_t* dst, uint64_t upto) {
    std::optional<TimeSplit::Scope> timed;
    if (verify_) timed.emplace(split_, TimeSplit::kHash);
    while (next_ < last_) {
      uint64_t lo = std::max(fed_, rec_.offset - begin_), hi = std::min(upto, rec_.offset + rec_.raw_bytes - begin_);
      if (hi <= lo) break;
      checker_.Feed(dst + lo, hi - lo);
      fed_ = hi;
      if (hi < rec_.offset + rec_.raw_bytes - begin_) break;  // rest of this chunk still to come
      if (std::optional<format::internal::ChunkFault> fault = checker_.Finish())
        throw c_.ChunkError(ErrorKind::kCorrupt, next_, fault->Describe());
      ++next_;
      Advance();
    }
  }
  bool done() const { return next_ >= last_; }
  uint64_t pending() const { return next_; }

 private:
  void Advance() {
    while (next_ < last_ && !d_.needed(next_)) ++next_;
    if (next_ >= last_) return;
    rec_ = c_.chunk(next_);
    fed_ = rec_.offset - begin_;
    checker_.Begin(rec_, nullptr, verify_);
  }

  const Container& c_;
  const Destinations& d_;
  uint64_t begin_, next_, last_;
  bool verify_;
  TimeSplit& split_;
  format::internal::ChunkChecker checker_;
  format::ChunkRecord rec_;
  uint64_t fed_ = 0;  // span bytes of the current chunk fed so far end here
};

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older kernels say EINVAL and pages fault as touched
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels say EINVAL and nothing changes
#endif

// Fresh destination memory costs a page fault per page when the read first writes it: the
// range is populated in one call first (src/loader/README.md has what it measured). Memory that
// is already there (an in-place load's tensors) is not: populating walks and pins every page
// again, about 0.1 s a GiB, while mincore, which only reads the page tables, says in well under
// 1 ms that nothing needs it. Only the whole pages inside the range are populated: rounding out
// could reach memory beyond the destination (another mapping, when the page is larger than the
// allocation's granularity), and the partial pages at its ends fault in as they are written.
void PopulateForWrite(uint8_t* dst, uint64_t len) {
  if (AllPagesResident(dst, len).value_or(false)) return;
  uintptr_t begin = PageCeil(reinterpret_cast<uintptr_t>(dst));
  uintptr_t end = PageFloor(reinterpret_cast<uintptr_t>(dst) + len);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
}

using format::internal::kHashPiece;

// Bytes not in the page cache: O_DIRECT reads of this size, this many in flight per reader
// thread, straight into the destination (the depth and size src/loader/README.md measured best).
constexpr uint64_t kUncachedPiece = 8 << 20;
constexpr size_t kUncachedDepth = 8;

}  // namespace

void ChunkReader::ReadSpan(uint64_t begin, uint64_t end, uint8_t* dst, uint64_t first, uint64_t last,
                           const Destinations& d) const {
  SpanChecker checker(c_, d, begin, first, last, verify_, split_);
  for (uint64_t at = 0; at < end - begin && !checker.done();) {
    uint64_t want = std::min(kHashPiece, end - begin - at);
    uint64_t got = ReadFile(begin + at, want, dst + at);
    at += got;
    checker.Feed(dst, at);
    if (got < want) break;  // end of file
  }
  if (!checker.done())
    throw Error(ErrorKind::kIo, FileShrankMessage(c_.path(), begin, end) + " (reading " + c_.DescribeChunk(checker.pending()) + ")");
}

void ChunkReader::CopyFromMapping() {
  // A local file's own mapping (not memory a caller opened the container from, nor an object).
  if (!remote_ && ContainerFile::Of(c_).owns_mapping() && method_ != ReadMethod::kDirect) slots_from_mapping_ = true;
}

bool ChunkReader::InMapping(const Batch& b) const { return slots_from_mapping_ && b.in_slot && !b.zstd; }

void ChunkReader::CheckAfterCopy(const Batch& b, const Destinations& d) const {
  if (!verify_) return;
  try {
    (void)CheckInMapping(b, d);
  } catch (const Error& e) {
    throw Error(e.kind(), std::string(e.what()) + " (after its copy from the file's mapping: the file was written in "
                                                   "place during the load)", e.place());
  }
}

const uint8_t* ChunkReader::CheckInMapping(const Batch& b, const Destinations& d) const {
  const uint8_t* base = ContainerFile::Data(c_) + b.file_begin;
  const uint64_t n = std::min(b.file_end, c_.file_bytes()) - b.file_begin;
  // The batch's pages mapped in with one call (the device's reads through the host's page tables
  // then find them; the hash faults none), from the page the batch starts in, counted from the
  // mapping's page-aligned start. EFAULT: a page of it is gone, the file shrank (verify off
  // hashes nothing, so this is what keeps the device from reading a page that is gone).
  const uint8_t* first_page = ContainerFile::Data(c_) + PageFloor(b.file_begin);
  if (n > 0 && madvise(const_cast<uint8_t*>(first_page), static_cast<size_t>(base + n - first_page), MADV_POPULATE_READ) != 0 &&
      errno == EFAULT)
    throw Error(ErrorKind::kIo, FileShrankMessage(c_.path(), b.file_begin, b.file_begin + n));
  SpanChecker checker(c_, d, b.file_begin, b.first, b.last, verify_, split_);
  for (uint64_t at = 0; at < n && !checker.done();) {
    uint64_t want = std::min(kHashPiece, n - at);
    auto feed = [&] { checker.Feed(base, at + want); };  // hashing only: guard-safe
    if (!Guarded(base + at, want, feed))
      throw Error(ErrorKind::kIo, FileShrankMessage(c_.path(), b.file_begin + at, b.file_begin + at + want) +
                                      " (checking " + c_.DescribeChunk(checker.pending()) + ")");
    at += want;
  }
  if (!checker.done())
    throw Error(ErrorKind::kIo, FileShrankMessage(c_.path(), b.file_begin, b.file_end) + " (checking " +
                                    c_.DescribeChunk(checker.pending()) + ")");
  return base;
}

const uint8_t* ChunkReader::Read(const Batch& b, const Plan& plan, const Destinations& d, uint8_t* slot) const {
  if (remote_) {
    ReadRemote(b, plan, d, slot);
    return slot;
  }
  if (!b.in_slot) {
    ReadIntoDestinations(b, d);
    return nullptr;
  }
  if (InMapping(b)) return CheckInMapping(b, d);
  if (!b.zstd) {
    ReadSpan(b.file_begin, b.file_end, slot, b.first, b.last, d);
    return slot;
  }
  for (uint64_t i = b.first; i < b.last; ++i) {
    if (!d.needed(i)) continue;
    // zstd frames are read (pread, whatever the method), checked and decoded by the container
    // (all of it counted as reading).
    TimeSplit::Scope timed(split_, TimeSplit::kRead);
    c_.ReadChunk(i, slot + plan.slot_offset[i], verify_);
  }
  return slot;
}

namespace {

// Walks the needed chunks of batch `b`: a zstd chunk alone, zstd(i, dst); consecutive raw chunks
// adjacent both in the file and in memory (a storage's run) as one, run(offset, len, dst, i, j)
// for chunks [i, j).
template <typename DstOf, typename Zstd, typename Run>
void ForEachRun(const Container& c, const Batch& b, const Destinations& d, DstOf dst_of, Zstd zstd, Run run) {
  uint64_t i = b.first;
  while (i < b.last) {
    if (!d.needed(i)) {
      ++i;
      continue;
    }
    const format::ChunkRecord r = c.chunk(i);
    uint8_t* dst = dst_of(i);
    if (IsZstd(r)) {
      zstd(i, dst, r);
      ++i;
      continue;
    }
    uint64_t j = i + 1, len = r.raw_bytes;
    for (; j < b.last && d.needed(j); ++j) {
      format::ChunkRecord n = c.chunk(j);
      if (IsZstd(n) || n.offset != r.offset + len || dst_of(j) != dst + len) break;
      len += n.raw_bytes;
    }
    run(r.offset, len, dst, i, j);
    i = j;
  }
}

}  // namespace

void ChunkReader::ReadRemote(const Batch& b, const Plan& plan, const Destinations& d, uint8_t* slot) const {
  // The batch's raw runs in one read of extents (the object groups them into GETs in flight at
  // once), then each chunk checked where it landed; one that fails is fetched again alone
  // (ReadChunk, which retries it and then names it).
  struct Run {
    uint64_t offset;
    uint8_t* dst;
    uint64_t first, last;
  };
  std::vector<ByteExtent> extents;
  std::vector<Run> runs;
  ForEachRun(
      c_, b, d, [&](uint64_t i) { return b.in_slot ? slot + plan.slot_offset[i] : d.of(i)[0].dst; },
      [&](uint64_t i, uint8_t* dst, const format::ChunkRecord&) {
        TimeSplit::Scope timed(split_, TimeSplit::kRead);
        c_.ReadChunk(i, dst, verify_);
      },
      [&](uint64_t offset, uint64_t len, uint8_t* dst, uint64_t first, uint64_t last) {
        extents.push_back({offset, len, dst});
        runs.push_back({offset, dst, first, last});
      });
  {
    TimeSplit::Scope timed(split_, TimeSplit::kRead);
    ContainerFile::Of(c_).remote()->ReadExtents(extents);
  }
  if (!verify_) return;
  TimeSplit::Scope timed(split_, TimeSplit::kHash);  // with any re-fetch of a bad chunk
  thread_local format::internal::ChunkChecker checker;
  for (const Run& r : runs)
    for (uint64_t k = r.first; k < r.last; ++k) {
      format::ChunkRecord n = c_.chunk(k);
      if (checker.Check(n, r.dst + (n.offset - r.offset))) c_.ReadChunk(k, r.dst + (n.offset - r.offset), true);
    }
}

void ChunkReader::ReadIntoDestinations(const Batch& b, const Destinations& d) const {
  std::vector<DestinationSpan> spans;
  ForEachRun(
      c_, b, d, [&](uint64_t i) { return d.of(i)[0].dst; },
      [&](uint64_t i, uint8_t* dst, const format::ChunkRecord& r) {
        PopulateForWrite(dst, r.raw_bytes);
        TimeSplit::Scope timed(split_, TimeSplit::kRead);
        c_.ReadChunk(i, dst, verify_);
      },
      [&](uint64_t offset, uint64_t len, uint8_t* dst, uint64_t first, uint64_t last) {
        spans.push_back({offset, offset + len, dst, first, last});
      });
  ReadDestinationSpans(spans, d);
}

bool ChunkReader::Resident(uint64_t offset, uint64_t len) const {
  // The container's mapping of the file shows the page cache; unknown: read buffered.
  return AllPagesResident(ContainerFile::Data(c_) + offset, len).value_or(true);
}

uint64_t ChunkReader::UncachedLength(const DestinationSpan& s, uint64_t at, uint64_t window) const {
  // kDirect reads every range through o_direct_fd_ already; kPread has it only for uncached ranges.
  if (method_ != ReadMethod::kPread || o_direct_fd_ < 0) return 0;
  // O_DIRECT wants memory, offset and length in whole blocks (4 KiB covers every device here);
  // the sub-block tail of a span goes through the page cache.
  if (reinterpret_cast<uintptr_t>(s.dst + at) % kDirectIoAlign != 0 || (s.begin + at) % kDirectIoAlign != 0) return 0;
  uint64_t len = window / kDirectIoAlign * kDirectIoAlign;
  if (len == 0 || Resident(s.begin + at, len)) return 0;
  return len;
}

void ChunkReader::ReadDestinationSpans(const std::vector<DestinationSpan>& spans, const Destinations& d) const {
  std::vector<std::unique_ptr<SpanChecker>> checkers;
  checkers.reserve(spans.size());
  for (const DestinationSpan& s : spans)
    checkers.push_back(std::make_unique<SpanChecker>(c_, d, s.begin, s.first, s.last, verify_, split_));
  auto shrank = [&](size_t k) {
    return Error(ErrorKind::kIo, FileShrankMessage(c_.path(), spans[k].begin, spans[k].end) + " (reading " +
                                     c_.DescribeChunk(checkers[k]->pending()) + ")");
  };
  // Uncached windows in flight, oldest first. A future of std::async waits for its read in its
  // destructor, so an exception never leaves a read writing into memory being freed.
  struct InFlight {
    size_t span;
    uint64_t at, len;
    std::future<uint64_t> got;
  };
  std::deque<InFlight> queue;
  auto finish_oldest = [&] {
    InFlight f = std::move(queue.front());
    queue.pop_front();
    uint64_t got;
    {
      TimeSplit::Scope timed(split_, TimeSplit::kRead);  // the O_DIRECT read still in flight
      got = f.got.get();
    }
    uncached_bytes_ += got;
    checkers[f.span]->Feed(spans[f.span].dst, f.at + got);  // hashed right as it lands, in order
    if (got < f.len) throw shrank(f.span);
  };
  size_t k = 0;     // the span being issued
  uint64_t at = 0;  // its next byte not yet issued
  while (k < spans.size() || !queue.empty()) {
    if (k == spans.size()) {
      finish_oldest();
      continue;
    }
    const DestinationSpan& s = spans[k];
    const uint64_t total = s.end - s.begin;
    if (at >= total) {
      ++k;
      at = 0;
      continue;
    }
    const uint64_t window = std::min(kUncachedPiece, total - at);
    if (uint64_t len = UncachedLength(s, at, window)) {
      if (queue.size() >= kUncachedDepth) {
        finish_oldest();
        continue;
      }
      queue.push_back({k, at, len, std::async(std::launch::async, [this, off = s.begin + at, len, p = s.dst + at] {
                         return Pread(o_direct_fd_, off, len, p);
                       })});
      at += len;
      continue;
    }
    if (!queue.empty()) {  // a span is hashed in file order: what is in flight first
      finish_oldest();
      continue;
    }
    // Cached (or not block-aligned): through the page cache, in pieces checked while in L2.
    PopulateForWrite(s.dst + at, window);
    for (const uint64_t stop = at + window; at < stop;) {
      uint64_t want = std::min(kHashPiece, stop - at);
      uint64_t got = ReadFile(s.begin + at, want, s.dst + at);
      at += got;
      checkers[k]->Feed(s.dst, at);
      if (got < want) throw shrank(k);
    }
  }
  for (size_t i = 0; i < spans.size(); ++i)
    if (!checkers[i]->done()) throw shrank(i);
}

}  // namespace zckpt::loader
