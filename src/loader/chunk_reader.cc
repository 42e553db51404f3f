#include "loader/chunk_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/mapped_file.h"
#include "format/chunk_codec.h"
#include "loader/plan.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::loader {

namespace {

bool IsZstd(const format::ChunkRecord& r) { return r.codec == static_cast<uint8_t>(format::Codec::kZstd); }

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
  if (method_ == ReadMethod::kDirect) {
    fd_ = ::open(c_.path().c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd_ >= 0 && !DirectReadWorks(fd_)) {
      ::close(fd_);
      fd_ = -1;
    }
    if (fd_ < 0) method_ = ReadMethod::kPread;
  }
  if (fd_ < 0) fd_ = ::open(c_.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(ErrorKind::kIo, "cannot open " + c_.path() + ": " + std::strerror(errno));
}

ChunkReader::~ChunkReader() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t ChunkReader::ReadFile(uint64_t offset, uint64_t len, uint8_t* dst) const {
  if (method_ == ReadMethod::kMmap) {
    uint64_t size = c_.file_bytes();
    uint64_t n = offset >= size ? 0 : std::min(len, size - offset);
    std::memcpy(dst, c_.data() + offset, n);
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
    if (n == 0) break;  // end of file (an O_DIRECT span rounded past it)
    done += static_cast<uint64_t>(n);
  }
  return done;
}

void ChunkReader::ReadExact(uint64_t offset, uint64_t len, uint8_t* dst) const {
  if (ReadFile(offset, len, dst) < len)
    throw Error(ErrorKind::kIo, c_.path() + ": unexpected end of file at " + std::to_string(offset + len));
}

void ChunkReader::Check(uint64_t chunk, const uint8_t* raw) const {
  if (!verify_) return;
  format::ChunkRecord r = c_.chunk(chunk);
  uint64_t got = format::Checksum(raw, r.raw_bytes);
  if (got != r.stored_checksum)
    throw Error(ErrorKind::kCorrupt,
                c_.DescribeChunk(chunk) + ": " + format::internal::ChecksumMismatch("stored", r.stored_checksum, got));
}

void ChunkReader::Read(const Batch& b, const Plan& plan, const Destinations& d, uint8_t* slot) const {
  if (!b.in_slot) return ReadDirect(b, d);
  if (!b.zstd) return ReadSlotRaw(b, d, slot);
  for (uint64_t i = b.first; i < b.last; ++i) {
    if (!d.needed(i)) continue;
    // zstd frames are decoded (and checked) by the container from its mapping.
    c_.ReadChunk(i, slot + plan.slot_offset[i], verify_);
    format::ChunkRecord r = c_.chunk(i);
    c_.file().Release(r.offset, r.stored_bytes);
  }
}

void ChunkReader::ReadSlotRaw(const Batch& b, const Destinations& d, uint8_t* slot) const {
  // One read for the whole span: small chunks (and the padding between them) in one go.
  uint64_t got = ReadFile(b.file_begin, b.file_end - b.file_begin, slot);
  for (uint64_t i = b.first; i < b.last; ++i) {
    if (!d.needed(i)) continue;
    format::ChunkRecord r = c_.chunk(i);
    if (r.offset + r.raw_bytes - b.file_begin > got)
      throw Error(ErrorKind::kIo, c_.path() + ": unexpected end of file reading " + c_.DescribeChunk(i));
    Check(i, slot + (r.offset - b.file_begin));
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
      c_.ReadChunk(i, dst, verify_);
      c_.file().Release(r.offset, r.stored_bytes);
      ++i;
      continue;
    }
    // Consecutive raw chunks adjacent both in the file and in memory (a storage's run): one read.
    uint64_t j = i + 1, len = r.raw_bytes;
    for (; j < b.last && d.needed(j); ++j) {
      format::ChunkRecord n = c_.chunk(j);
      if (IsZstd(n) || n.offset != r.offset + len || d.of(j)[0].dst != dst + len) break;
      len += n.raw_bytes;
    }
    ReadExact(r.offset, len, dst);
    for (uint64_t k = i; k < j; ++k) Check(k, d.of(k)[0].dst);
    i = j;
  }
}

}  // namespace zckpt::loader
