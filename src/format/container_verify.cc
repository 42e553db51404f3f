// Spec §7 "Verification": every byte of the data region, in parallel.
//
// The data region [64, index_offset) is cut into one contiguous byte range per thread; a thread
// checks every chunk and blob that starts in its range (whole: a checksum cannot be split) and
// every padding byte inside its range. Cutting by bytes rather than by chunk count keeps threads
// balanced when chunk sizes differ (zstd chunks, small storages).
//
// Bytes are read from the mapping, each byte once: a raw chunk's or a blob's XXH3 and the zero
// test of padding read the mapped bytes directly, under a SIGBUS guard (common/fault_guard.h),
// so a file truncated meanwhile ends in Error(kIo) naming it, not a SIGBUS; a file rewritten
// meanwhile changes at most the verdict, since nothing checked is read twice. A zstd chunk is
// read twice (hashed and decoded), so its pieces are first copied (guarded) into a per-thread
// buffer and both read that copy: the checksum and the decoder see the same bytes (reading
// everything with pread costs more CPU: src/format/README.md). Pages are released behind the scan so verifying a file larger than RAM keeps the
// resident set to a few slices per thread.

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "common/fault_guard.h"
#include "common/mapped_file.h"
#include "format/bytes.h"
#include "format/chunk_check.h"
#include "format/container_file.h"
#include "format/refetch.h"
#include "zckpt/container.h"

namespace zckpt {

namespace {

using format::internal::AllZero;
using format::internal::ChecksumMismatch;
using format::internal::ChunkChecker;
using format::internal::ChunkFault;
using format::internal::ContainerFile;
using format::internal::FirstNonZero;
using format::internal::Xxh3Stream;

constexpr uint64_t kSliceBytes = 4ull << 20;  // between progress/cancel checks and page releases
constexpr uint64_t kCopyBytes = 1ull << 20;   // a zstd chunk's pieces, copied then hashed in cache
constexpr uint64_t kMinBytesPerThread = 4ull << 20;  // below this another thread costs more than it saves

struct Region {
  uint64_t offset = 0, end = 0;
  int64_t chunk = -1;  // chunk index, or -1 for a blob
  uint32_t blob = 0;
};

struct Found {
  uint64_t offset;  // sort key: where in the file
  VerifyProblem problem;
};

std::string Num(uint64_t v) { return std::to_string(v); }

class Verifier {
 public:
  Verifier(const Container& c, const VerifyOptions& o) : c_(c), o_(o), data_end_(c.footer().index_offset) {}

  VerifyReport Run();

 private:
  void Worker(uint64_t begin, uint64_t end, std::vector<Found>* out);
  void CheckChunk(const Region& r, ChunkChecker* checker, std::vector<Found>* out);
  void CheckBlob(const Region& r, std::vector<Found>* out);
  void CheckGap(uint64_t gap_begin, uint64_t gap_end, uint64_t from, uint64_t to, std::vector<Found>* out);
  // Calls fn(piece, len) over [offset, offset+n) of the mapping slice by slice, releasing each
  // slice's pages and reporting progress after it; stops early when fn returns false (the rest
  // still counts as done) or on cancel. fn runs under the SIGBUS guard, so it must be plain code
  // over the bytes (no allocation: see fault_guard.h). With `copy`, each piece is first copied
  // (guarded) into the thread's buffer and fn, unguarded, reads the copy.
  template <typename Fn>
  void Scan(uint64_t offset, uint64_t n, bool copy, Fn&& fn);
  bool Cancelled() const {
    return stop_.load(std::memory_order_relaxed) || (o_.cancel && o_.cancel->load(std::memory_order_relaxed));
  }
  void Progress(uint64_t bytes);
  // Runs check(found) over a region of `bytes` (`chunks` chunks); from an object, a region found damaged is read
  // and checked again (the bytes may have been damaged on the way), with backoff, and reported
  // only when the damage persists ("(the same after N fetches)").
  template <typename Check>
  void Refetching(uint64_t bytes, uint64_t chunks, std::vector<Found>* out, Check&& check);

  const Container& c_;
  const VerifyOptions& o_;
  const uint64_t data_end_;
  std::vector<Region> regions_;
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> chunks_checked_{0};
  std::atomic<bool> stop_{false};
  std::mutex progress_mutex_;
};

// One copy buffer per verifying thread.
uint8_t* ThreadBuffer() {
  thread_local std::vector<uint8_t> buffer(kCopyBytes);
  return buffer.data();
}

template <typename Fn>
void Verifier::Scan(uint64_t offset, uint64_t n, bool copy, Fn&& fn) {
  bool going = true;
  for (uint64_t at = 0; at < n;) {
    const uint64_t len = std::min(copy || ContainerFile::Of(c_).remote() ? kCopyBytes : kSliceBytes, n - at);
    const uint8_t* mapped = ContainerFile::Data(c_) + offset + at;
    if (going && !Cancelled() && ContainerFile::Of(c_).remote()) {
      // An object: no mapping; the bytes come by ranged GET into the thread's buffer.
      uint8_t* buffer = ThreadBuffer();
      ContainerFile::Of(c_).ReadAt(offset + at, len, buffer);
      going = fn(buffer, len);
    } else if (going && !Cancelled()) {
      bool shrank;
      if (copy) {
        uint8_t* buffer = ThreadBuffer();
        shrank = !GuardedCopy(buffer, mapped, len);
        if (!shrank) going = fn(buffer, len);
      } else {
        auto body = [&] { going = fn(mapped, len); };
        shrank = !Guarded(mapped, len, body);
      }
      if (shrank) throw Error(ErrorKind::kIo, FileShrankMessage(c_.path(), offset + at, offset + at + len));
    }
    ContainerFile::Of(c_).Release(offset + at, len);
    Progress(len);
    at += len;
  }
}

template <typename Check>
void Verifier::Refetching(uint64_t bytes, uint64_t chunks, std::vector<Found>* out, Check&& check) {
  const format::internal::Refetch refetch(ContainerFile::Of(c_).remote());
  for (unsigned attempt = 1;; ++attempt) {
    std::vector<Found> found;
    check(&found);
    if (found.empty() || Cancelled() || !refetch.Again(attempt)) {
      for (Found& f : found) {
        f.problem.message += refetch.Persisted();
        out->push_back(std::move(f));
      }
      return;
    }
    done_.fetch_sub(bytes, std::memory_order_relaxed);  // counted again by the next pass
    chunks_checked_.fetch_sub(chunks, std::memory_order_relaxed);
  }
}

void Verifier::Progress(uint64_t bytes) {
  done_.fetch_add(bytes, std::memory_order_relaxed);
  if (!o_.progress) return;
  // Calls are serialized, and read the counter under the lock so reports never go backwards; a
  // thread that finds another one reporting skips its report.
  std::unique_lock<std::mutex> lock(progress_mutex_, std::try_to_lock);
  if (lock.owns_lock()) o_.progress(done_.load(), c_.file_bytes());
}

void Verifier::CheckChunk(const Region& r, ChunkChecker* checker, std::vector<Found>* out) {
  const uint64_t i = static_cast<uint64_t>(r.chunk);
  format::ChunkRecord ch = c_.chunk(i);
  const bool is_zstd = format::IsZstd(ch);
  checker->Begin(ch);
  // A zstd chunk is copied first: the hash and the decoder must read the same bytes.
  Scan(ch.offset, ch.stored_bytes, /*copy=*/is_zstd, [&](const uint8_t* p, uint64_t n) {
    checker->Feed(p, n);
    return true;
  });
  if (Cancelled()) return;
  chunks_checked_.fetch_add(1, std::memory_order_relaxed);
  if (std::optional<ChunkFault> fault = checker->Finish())
    out->push_back({ch.offset, VerifyProblem::Of(c_.ChunkError(ErrorKind::kCorrupt, i, fault->Describe()))});
}

void Verifier::CheckBlob(const Region& r, std::vector<Found>* out) {
  BlobInfo b = c_.blob(r.blob);
  Xxh3Stream hash;
  Scan(b.offset, b.bytes, /*copy=*/false, [&](const uint8_t* p, uint64_t n) {
    hash.Update(p, n);
    return true;
  });
  uint64_t got = hash.Digest();
  if (Cancelled() || got == b.checksum) return;
  ErrorPlace place;
  place.file = c_.path();
  place.file_bytes = ByteRange{b.offset, b.offset + b.bytes};
  out->push_back({b.offset, {ErrorKind::kCorrupt,
                             c_.path() + ": blob '" + std::string(b.name) + "', file bytes [" + Num(b.offset) + ", " +
                                 Num(b.offset + b.bytes) + "): " + ChecksumMismatch("blob", b.checksum, got),
                             std::move(place)}});
}

void Verifier::CheckGap(uint64_t gap_begin, uint64_t gap_end, uint64_t from, uint64_t to, std::vector<Found>* out) {
  uint64_t at = from, bad = UINT64_MAX;
  Scan(from, to - from, /*copy=*/false, [&](const uint8_t* p, uint64_t n) {
    if (AllZero(p, n)) {
      at += n;
      return true;
    }
    bad = at + FirstNonZero(p, n);
    return false;
  });
  if (bad == UINT64_MAX) return;
  ErrorPlace place;
  place.file = c_.path();
  place.file_bytes = ByteRange{gap_begin, gap_end};
  out->push_back({gap_begin, {ErrorKind::kCorrupt,
                              c_.path() + ": padding bytes [" + Num(gap_begin) + ", " + Num(gap_end) +
                                  ") are not zero (first nonzero byte at file offset " + Num(bad) + ")",
                              std::move(place)}});
}

void Verifier::Worker(uint64_t begin, uint64_t end, std::vector<Found>* out) {
  ChunkChecker checker;
  auto first = std::lower_bound(regions_.begin(), regions_.end(), begin,
                                [](const Region& r, uint64_t v) { return r.offset < v; });
  size_t i = static_cast<size_t>(first - regions_.begin());
  // A region starting before `begin` belongs to the previous thread, even where it reaches in.
  uint64_t gap_begin = i > 0 ? regions_[i - 1].end : format::kSuperblockBytes;
  uint64_t cursor = std::max(begin, gap_begin);
  for (;; ++i) {
    uint64_t next = i < regions_.size() ? regions_[i].offset : data_end_;
    uint64_t stop = std::min(next, end);
    if (cursor < stop) Refetching(stop - cursor, 0, out, [&](std::vector<Found>* o) { CheckGap(gap_begin, next, cursor, stop, o); });
    if (i >= regions_.size() || regions_[i].offset >= end || Cancelled()) break;
    const Region& r = regions_[i];
    if (r.chunk >= 0) {
      Refetching(r.end - r.offset, 1, out, [&](std::vector<Found>* o) { CheckChunk(r, &checker, o); });
    } else {
      Refetching(r.end - r.offset, 0, out, [&](std::vector<Found>* o) { CheckBlob(r, o); });
    }
    cursor = gap_begin = r.end;
  }
}

VerifyReport Verifier::Run() {
  // Chunks are already in file order; blobs are merged in by offset (open checked no overlap).
  for (uint64_t i = 0; i < c_.chunk_count(); ++i) {
    format::ChunkRecord ch = c_.chunk(i);
    regions_.push_back({ch.offset, ch.offset + ch.stored_bytes, static_cast<int64_t>(i), 0});
  }
  for (uint32_t b = 0; b < c_.blob_count(); ++b) {
    BlobInfo info = c_.blob(b);
    if (info.bytes > 0) regions_.push_back({info.offset, info.offset + info.bytes, -1, b});
  }
  std::sort(regions_.begin(), regions_.end(), [](const Region& a, const Region& b) { return a.offset < b.offset; });

  const uint64_t data_bytes = data_end_ - format::kSuperblockBytes;
  done_ = c_.file_bytes() - data_bytes;  // superblock, index and footer were checked at open
  unsigned threads = o_.threads.value_or(0u) ? *o_.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::clamp<uint64_t>(data_bytes / kMinBytesPerThread, 1, threads));
  ContainerFile::Of(c_).AdviseSequential(format::kSuperblockBytes, data_bytes);

  std::vector<std::vector<Found>> found(threads);
  std::vector<std::exception_ptr> errors(threads);
  auto run = [&](unsigned t) {
    try {
      uint64_t begin = format::kSuperblockBytes + data_bytes / threads * t;
      uint64_t end = t + 1 == threads ? data_end_ : begin + data_bytes / threads;
      Worker(begin, end, &found[t]);
    } catch (...) {
      errors[t] = std::current_exception();
      stop_ = true;
    }
  };
  if (threads == 1) {
    run(0);  // no thread for small files: Verify of a few KB stays a few microseconds
  } else {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) pool.emplace_back(run, t);
    for (auto& th : pool) th.join();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  if (o_.cancel && o_.cancel->load()) throw Error(ErrorKind::kCancelled, c_.path() + ": verification cancelled");

  std::vector<Found> all;
  for (auto& f : found) all.insert(all.end(), std::make_move_iterator(f.begin()), std::make_move_iterator(f.end()));
  // A gap split between threads may be reported by each: keep its first report.
  std::stable_sort(all.begin(), all.end(), [](const Found& a, const Found& b) { return a.offset < b.offset; });
  VerifyReport report;
  for (size_t k = 0; k < all.size(); ++k)
    if (k == 0 || all[k].offset != all[k - 1].offset || all[k].problem.place.chunk >= 0)
      report.problems.push_back(std::move(all[k].problem));
  report.bytes_checked = done_.load();
  report.chunks_checked = chunks_checked_.load();
  if (o_.progress) o_.progress(report.bytes_checked, c_.file_bytes());
  return report;
}

}  // namespace

VerifyReport Container::Verify(const VerifyOptions& options) const { return Verifier(*this, options).Run(); }

}  // namespace zckpt
