#include "loader/chunk_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/xxh3.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "common/fault_guard.h"
#include "common/mapped_file.h"
#include "format/chunk_codec.h"
#include "loader/plan.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::loader {

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

}  // namespace

ChunkReader::ChunkReader(const Container& c, ReadMethod method, bool verify)
    : c_(c), method_(method), verify_(verify) {
  if (method_ == ReadMethod::kMmap) {
    c_.file().AdviseSequential(0, c_.file_bytes());
    return;
  }
  // The container's own descriptor: the file whose index was validated, whatever the path names
  // by now (reopening the path could read another file, or block on a FIFO swapped in).
  fd_ = c_.file().fd();
  if (method_ == ReadMethod::kDirect) {
    // O_DIRECT needs a descriptor of its own (the flag belongs to the open file description);
    // /proc/self/fd reopens the same inode, checked below, never the path.
    int direct = -1;
    if (fd_ >= 0) {
      direct = ::open(("/proc/self/fd/" + std::to_string(fd_)).c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NOCTTY);
      struct stat a, b;
      if (direct >= 0 && (fstat(direct, &a) != 0 || fstat(fd_, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev ||
                          !DirectReadWorks(direct))) {
        ::close(direct);
        direct = -1;
      }
    }
    if (direct >= 0) {
      fd_ = direct_fd_ = direct;
    } else {
      method_ = ReadMethod::kPread;
    }
  }
  if (fd_ < 0) throw Error(ErrorKind::kInvalidArgument, c_.path() + ": a container opened from memory has no file to read");
}

ChunkReader::~ChunkReader() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

uint64_t ChunkReader::ReadFile(uint64_t offset, uint64_t len, uint8_t* dst) const {
  uint64_t size = c_.file_bytes();
  if (method_ == ReadMethod::kMmap) {
    uint64_t n = offset >= size ? 0 : std::min(len, size - offset);
    // The mapping is shared with whoever else has the file: a page past a truncation raises
    // SIGBUS, which GuardedCopy turns into this error. (Bytes rewritten meanwhile land in dst and
    // are hashed there, as with pread.)
    if (!GuardedCopy(dst, c_.data() + offset, n)) throw Error(ErrorKind::kIo, FileShrankMessage(c_.path(), offset, offset + n));
    // Drop what was just copied so the mapping's resident pages stay bounded by what is in flight.
    c_.file().Release(offset, n);
    return n;
  }
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd_, dst + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::kIo, "cannot read " + c_.path() + " at " + std::to_string(offset + done) + ": " +
                                      std::strerror(errno));
    }
    if (n == 0) break;  // end of file (an O_DIRECT span rounded past it, or a file that shrank)
    done += static_cast<uint64_t>(n);
  }
  return done;
}

namespace {

// XXH3 of each needed chunk of a span, fed in file order as pieces of the span arrive.
class SpanHasher {
 public:
  SpanHasher(const Container& c, const Destinations& d, uint64_t begin, uint64_t first, uint64_t last, bool verify)
      : c_(c), d_(d), begin_(begin), next_(first), last_(last), verify_(verify) {
    if (verify_ && (state_ = XXH3_createState()) == nullptr) throw std::bad_alloc();
    Advance();
  }
  ~SpanHasher() { XXH3_freeState(state_); }
  SpanHasher(const SpanHasher&) = delete;
  SpanHasher& operator=(const SpanHasher&) = delete;

  // Span bytes [0, upto) are now in `dst`.
  void Feed(const uint8_t* dst, uint64_t upto) {
    while (next_ < last_) {
      uint64_t lo = std::max(fed_, rec_.offset - begin_), hi = std::min(upto, rec_.offset + rec_.raw_bytes - begin_);
      if (hi <= lo) break;
      if (verify_) XXH3_64bits_update(state_, dst + lo, hi - lo);
      fed_ = hi;
      if (hi < rec_.offset + rec_.raw_bytes - begin_) break;  // rest of this chunk still to come
      if (verify_) {
        uint64_t got = XXH3_64bits_digest(state_);
        if (got != rec_.stored_checksum)
          throw Error(ErrorKind::kCorrupt, c_.DescribeChunk(next_) + ": " +
                                               format::internal::ChecksumMismatch("stored", rec_.stored_checksum, got));
      }
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
    if (verify_) XXH3_64bits_reset(state_);
  }

  const Container& c_;
  const Destinations& d_;
  uint64_t begin_, next_, last_;
  bool verify_;
  XXH3_state_t* state_ = nullptr;
  format::ChunkRecord rec_;
  uint64_t fed_ = 0;  // span bytes of the current chunk hashed so far end here
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels say EINVAL and nothing changes
#endif

// Fresh destination memory costs a page fault per 4 KiB when the read first writes it; asking
// the kernel to populate the whole range in one call measured ~30% cheaper (1.3 s -> 0.93 s per
// GiB here), and fault cost is most of a CPU load's time (a 1 GiB load: 1.73 s -> 2.0 s without). Rounding out to whole pages is safe:
// those pages are mapped (they hold dst's first and last bytes), and populating changes no byte.
void PopulateForWrite(uint8_t* dst, uint64_t len) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t begin = reinterpret_cast<uintptr_t>(dst) / page * page;
  uintptr_t end = (reinterpret_cast<uintptr_t>(dst) + len + page - 1) / page * page;
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
}

// Small enough to still be in L2 when hashed right after the read; a multiple of 4 KiB for
// O_DIRECT.
constexpr uint64_t kReadPiece = 512 << 10;

}  // namespace

void ChunkReader::ReadSpan(uint64_t begin, uint64_t end, uint8_t* dst, uint64_t first, uint64_t last,
                           const Destinations& d) const {
  SpanHasher hasher(c_, d, begin, first, last, verify_);
  for (uint64_t at = 0; at < end - begin && !hasher.done();) {
    uint64_t want = std::min(kReadPiece, end - begin - at);
    uint64_t got = ReadFile(begin + at, want, dst + at);
    at += got;
    hasher.Feed(dst, at);
    if (got < want) break;  // end of file
  }
  if (!hasher.done())
    throw Error(ErrorKind::kIo, FileShrankMessage(c_.path(), begin, end) + " (reading " + c_.DescribeChunk(hasher.pending()) + ")");
}

void ChunkReader::Read(const Batch& b, const Plan& plan, const Destinations& d, uint8_t* slot) const {
  if (!b.in_slot) return ReadDirect(b, d);
  if (!b.zstd) return ReadSpan(b.file_begin, b.file_end, slot, b.first, b.last, d);
  for (uint64_t i = b.first; i < b.last; ++i) {
    if (!d.needed(i)) continue;
    // zstd frames are read (pread, whatever the method), checked and decoded by the container.
    c_.ReadChunk(i, slot + plan.slot_offset[i], verify_);
  }
}

void ChunkReader::ReadDirect(const Batch& b, const Destinations& d) const {
  uint64_t i = b.first;
  while (i < b.last) {
    if (!d.needed(i)) {
      ++i;
      continue;
    }
    format::ChunkRecord r = c_.chunk(i);
    uint8_t* dst = d.of(i)[0].dst;
    if (IsZstd(r)) {
      PopulateForWrite(dst, r.raw_bytes);
      c_.ReadChunk(i, dst, verify_);
      ++i;
      continue;
    }
    // Consecutive raw chunks adjacent both in the file and in memory (a storage's run): one span.
    uint64_t j = i + 1, len = r.raw_bytes;
    for (; j < b.last && d.needed(j); ++j) {
      format::ChunkRecord n = c_.chunk(j);
      if (IsZstd(n) || n.offset != r.offset + len || d.of(j)[0].dst != dst + len) break;
      len += n.raw_bytes;
    }
    PopulateForWrite(dst, len);
    ReadSpan(r.offset, r.offset + len, dst, i, j, d);
    i = j;
  }
}

}  // namespace zckpt::loader
