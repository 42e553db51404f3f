// Strict zip parsing; see zip_reader.h for why this exists instead of PyTorchStreamReader.
//
// Order of work: locate the end records, take the central directory's extent from them (ZIP64
// record when present), parse every central record, check each against its local header, then
// check the set as a whole (unique names, no overlapping payloads). Nothing read from the file
// is used as an offset or a length before it has been bounds-checked with overflow-safe
// arithmetic.
#include "pt/zip_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "pt/zip_format.h"
#include "zckpt/error.h"

namespace zckpt::pt {

namespace {

using namespace zipfmt;

// Does [offset, offset + length) lie inside [0, limit)? Never overflows.
bool Within(uint64_t offset, uint64_t length, uint64_t limit) {
  return offset <= limit && length <= limit - offset;
}

struct EndRecords {
  uint64_t entries = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
  uint64_t end_start = 0;  // first byte of the end records: the central directory ends here
};

// Which central-header fields were the 0xFFFFFFFF/0xFFFF sentinel and must come from ZIP64.
struct Zip64Needs {
  bool uncompressed = false;
  bool compressed = false;
  bool local_offset = false;
  bool disk = false;
};

// Every byte the parser looks at is first copied out of the file (MappedFile::ReadAt) into memory
// of its own, as the container reader does with its index: the end records (the file's last
// bytes, read at once), the central directory (one read), and anything else (a ZIP64 end record
// further back, each local header) on its own. A source truncated while it is parsed is therefore
// Error(kIo) naming it, never a SIGBUS from the mapping, and a byte checked once cannot change
// under the parser.
class Parser {
 public:
  explicit Parser(const MappedFile& file) : file_(file), path_(file.path()), size_(file.size()) {
    tail_.begin = size_ > kTailBytes ? size_ - kTailBytes : 0;
    tail_.bytes.resize(size_ - tail_.begin);
    file_.ReadAt(tail_.begin, tail_.bytes.size(), tail_.bytes.data());
  }

  EndRecords ReadEndRecords() const;
  std::vector<ZipEntry> ReadCentralDirectory(const EndRecords& end) const;
  void CheckUniqueAndDisjoint(const std::vector<ZipEntry>& entries,
                              std::unordered_map<std::string, size_t>* by_name) const;

 private:
  [[noreturn]] void Fail(ErrorKind kind, const std::string& what) const {
    throw Error(kind, path_ + ": " + what);
  }
  [[noreturn]] void FailEntry(ErrorKind kind, const ZipEntry& e, const std::string& what) const {
    Fail(kind, "zip entry '" + PrintableEntryName(e.name) + "' (central directory record at byte " +
                   std::to_string(e.central_offset) + "): " + what);
  }

  uint64_t FindEnd() const;
  bool ReadZip64End(uint64_t end_pos, EndRecords* out) const;
  ZipEntry ReadCentralRecord(uint64_t pos, uint64_t cd_end, uint64_t* next) const;
  void ApplyZip64Extra(const uint8_t* extra, uint64_t len, const Zip64Needs& needs, ZipEntry* e) const;
  void ReadLocalHeader(uint64_t cd_offset, ZipEntry* e) const;

  // Private bytes [pos, pos + n) of the file (the caller checked they lie inside it): a pointer
  // into the end records or central directory read earlier, else into scratch_, which the next
  // call may replace.
  const uint8_t* At(uint64_t pos, uint64_t n) const {
    for (const Window* w : {static_cast<const Window*>(&tail_), static_cast<const Window*>(&cd_)})
      if (pos >= w->begin && n <= w->bytes.size() && pos - w->begin <= w->bytes.size() - n)
        return w->bytes.data() + (pos - w->begin);
    scratch_.resize(n);
    file_.ReadAt(pos, n, scratch_.data());
    return scratch_.data();
  }

  struct Window {
    uint64_t begin = 0;
    std::vector<uint8_t> bytes;
  };
  // Where the end record and a ZIP64 locator must lie: a comment of at most 64 KiB after them.
  static constexpr uint64_t kTailBytes = kEndSize + kMaxCommentSize + kZip64LocatorSize;

  const MappedFile& file_;
  const std::string& path_;
  uint64_t size_;
  Window tail_;
  mutable Window cd_;
  mutable std::vector<uint8_t> scratch_;
};

// The end-of-central-directory record sits in the last 22 + 65535 bytes (its comment is at most
// 64 KiB); it is the last signature whose comment runs exactly to the end of the file.
uint64_t Parser::FindEnd() const {
  if (size_ >= kEndSize) {
    uint64_t lowest = size_ - kEndSize > kMaxCommentSize ? size_ - kEndSize - kMaxCommentSize : 0;
    for (uint64_t pos = size_ - kEndSize;; --pos) {
      const uint8_t* p = At(pos, kEndSize);
      if (Load32(p) == kEndSig && pos + kEndSize + Load16(p + kEndCommentLen) == size_)
        return pos;
      if (pos == lowest) break;
    }
  }
  if (size_ >= 4 && Load32(At(0, 4)) == kLocalHeaderSig)
    Fail(ErrorKind::kCorrupt, "zip archive has no end of central directory record (truncated?)");
  Fail(ErrorKind::kNotContainer, "not a zip archive (no end of central directory record)");
}

// Reads the ZIP64 locator just before the end record at `end_pos` and the ZIP64 end record it
// points to. Returns false when there is no locator (a plain zip, e.g. from Python's zipfile).
bool Parser::ReadZip64End(uint64_t end_pos, EndRecords* out) const {
  if (end_pos < kZip64LocatorSize) return false;
  const uint64_t loc_pos = end_pos - kZip64LocatorSize;
  const uint8_t* loc = At(loc_pos, kZip64LocatorSize);
  if (Load32(loc) != kZip64LocatorSig) return false;
  uint32_t total_disks = Load32(loc + kLocatorTotalDisks);
  if (Load32(loc + kLocatorDisk) != 0 || total_disks > 1)
    Fail(ErrorKind::kUnsupported, "multi-disk zip archives are not supported (ZIP64 locator at byte " +
                                      std::to_string(loc_pos) + ")");
  uint64_t z_pos = Load64(loc + kLocatorZip64EndOffset);
  if (!Within(z_pos, kZip64EndSize, loc_pos))
    Fail(ErrorKind::kCorrupt, "ZIP64 end of central directory offset " + std::to_string(z_pos) +
                                  " does not leave room for the record before its locator at byte " +
                                  std::to_string(loc_pos));
  const uint8_t* z = At(z_pos, kZip64EndSize);
  if (Load32(z) != kZip64EndSig)
    Fail(ErrorKind::kCorrupt, "no ZIP64 end of central directory signature at byte " + std::to_string(z_pos));
  // The record (with any extensible data) must end exactly where the locator starts.
  if (Load64(z + kZip64EndRecordSize) != loc_pos - z_pos - 12)
    Fail(ErrorKind::kCorrupt, "ZIP64 end of central directory record at byte " + std::to_string(z_pos) +
                                  " declares size " + std::to_string(Load64(z + kZip64EndRecordSize)) +
                                  " but its locator is at byte " + std::to_string(loc_pos));
  if (Load32(z + kZip64EndDisk) != 0 || Load32(z + kZip64EndCdDisk) != 0)
    Fail(ErrorKind::kUnsupported, "multi-disk zip archives are not supported (ZIP64 end record at byte " +
                                      std::to_string(z_pos) + ")");
  out->entries = Load64(z + kZip64EndTotalEntries);
  if (Load64(z + kZip64EndDiskEntries) != out->entries)
    Fail(ErrorKind::kCorrupt, "ZIP64 end record at byte " + std::to_string(z_pos) +
                                  " counts entries on this disk differently from the total");
  out->cd_size = Load64(z + kZip64EndCdSize);
  out->cd_offset = Load64(z + kZip64EndCdOffset);
  out->end_start = z_pos;
  return true;
}

EndRecords Parser::ReadEndRecords() const {
  const uint64_t end_pos = FindEnd();
  const uint8_t* end = At(end_pos, kEndSize);
  const std::string where = " (end of central directory record at byte " + std::to_string(end_pos) + ")";
  EndRecords r;
  const bool zip64 = ReadZip64End(end_pos, &r);
  // A 16/32-bit field of the plain record either agrees with the ZIP64 record or is the
  // sentinel telling readers to look there; anything else is a forgery or damage.
  auto agrees = [&](uint64_t field, uint64_t sentinel, uint64_t zip64_value) {
    return zip64 ? (field == sentinel || field == zip64_value) : true;
  };
  uint16_t disk = Load16(end + kEndDisk), cd_disk = Load16(end + kEndCdDisk);
  if (!agrees(disk, kSentinel16, 0) || !agrees(cd_disk, kSentinel16, 0) || (!zip64 && (disk != 0 || cd_disk != 0)))
    Fail(ErrorKind::kUnsupported, "multi-disk zip archives are not supported" + where);
  uint16_t disk_entries = Load16(end + kEndDiskEntries), total = Load16(end + kEndTotalEntries);
  uint32_t cd_size = Load32(end + kEndCdSize), cd_offset = Load32(end + kEndCdOffset);
  if (!zip64) {
    r = EndRecords{total, cd_offset, cd_size, end_pos};
    if (disk_entries != total) Fail(ErrorKind::kCorrupt, "entry counts disagree" + where);
  } else if (!agrees(disk_entries, kSentinel16, r.entries) || !agrees(total, kSentinel16, r.entries) ||
             !agrees(cd_size, kSentinel32, r.cd_size) || !agrees(cd_offset, kSentinel32, r.cd_offset)) {
    Fail(ErrorKind::kCorrupt, "end of central directory record disagrees with the ZIP64 record" + where);
  }
  if (r.cd_offset > r.end_start)
    Fail(ErrorKind::kCorrupt, "central directory offset " + std::to_string(r.cd_offset) +
                                  " is past the end records at byte " + std::to_string(r.end_start) +
                                  " (file size " + std::to_string(size_) + ")");
  if (r.cd_size != r.end_start - r.cd_offset)
    Fail(ErrorKind::kCorrupt, "central directory at byte " + std::to_string(r.cd_offset) + " of size " +
                                  std::to_string(r.cd_size) + " does not end where the end records start (byte " +
                                  std::to_string(r.end_start) + ")");
  if (r.entries > r.cd_size / kCentralHeaderSize)
    Fail(ErrorKind::kCorrupt, std::to_string(r.entries) + " entries cannot fit in a central directory of " +
                                  std::to_string(r.cd_size) + " bytes");
  return r;
}

std::vector<ZipEntry> Parser::ReadCentralDirectory(const EndRecords& end) const {
  std::vector<ZipEntry> entries;
  entries.reserve(end.entries);  // bounded by cd_size / 46 above
  const uint64_t cd_end = end.cd_offset + end.cd_size;
  cd_.begin = end.cd_offset;  // inside the file: it ends where the end records start
  cd_.bytes.resize(end.cd_size);
  file_.ReadAt(cd_.begin, cd_.bytes.size(), cd_.bytes.data());
  uint64_t pos = end.cd_offset;
  for (uint64_t i = 0; i < end.entries; ++i) {
    ZipEntry e = ReadCentralRecord(pos, cd_end, &pos);
    ReadLocalHeader(end.cd_offset, &e);
    entries.push_back(std::move(e));
  }
  if (pos != cd_end)
    Fail(ErrorKind::kCorrupt, "central directory has " + std::to_string(cd_end - pos) + " bytes after its " +
                                  std::to_string(end.entries) + " entries (at byte " + std::to_string(pos) + ")");
  return entries;
}

ZipEntry Parser::ReadCentralRecord(uint64_t pos, uint64_t cd_end, uint64_t* next) const {
  if (!Within(pos, kCentralHeaderSize, cd_end) || Load32(At(pos, kCentralHeaderSize)) != kCentralHeaderSig)
    Fail(ErrorKind::kCorrupt, "no central directory record at byte " + std::to_string(pos));
  const uint8_t* h = At(pos, kCentralHeaderSize);  // the whole record, once checked to lie in the directory
  const uint64_t name_len = Load16(h + kCentralNameLen), extra_len = Load16(h + kCentralExtraLen);
  const uint64_t record_len = kCentralHeaderSize + name_len + extra_len + Load16(h + kCentralCommentLen);
  if (!Within(pos, record_len, cd_end))
    Fail(ErrorKind::kCorrupt, "central directory record at byte " + std::to_string(pos) +
                                  " runs past the end of the central directory");
  *next = pos + record_len;
  h = At(pos, record_len);

  ZipEntry e;
  e.central_offset = pos;
  e.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
  e.flags = Load16(h + kCentralFlags);
  e.method = Load16(h + kCentralMethod);
  e.crc32 = Load32(h + kCentralCrc);
  e.compressed_size = Load32(h + kCentralCompressedSize);
  e.uncompressed_size = Load32(h + kCentralUncompressedSize);
  e.local_header_offset = Load32(h + kCentralLocalOffset);
  uint16_t disk = Load16(h + kCentralDiskStart);
  if (e.flags & (kFlagEncrypted | kFlagStrongEncryption | kFlagMaskedHeaders))
    FailEntry(ErrorKind::kUnsupported, e, "encrypted zip entries are not supported");

  Zip64Needs needs{e.uncompressed_size == kSentinel32, e.compressed_size == kSentinel32,
                   e.local_header_offset == kSentinel32, disk == kSentinel16};
  ApplyZip64Extra(h + kCentralHeaderSize + name_len, extra_len, needs, &e);
  if (!needs.disk && disk != 0) FailEntry(ErrorKind::kUnsupported, e, "entry starts on disk " + std::to_string(disk));
  if (e.method == kMethodStored && e.compressed_size != e.uncompressed_size)
    FailEntry(ErrorKind::kCorrupt, e, "STORED entry has compressed size " + std::to_string(e.compressed_size) +
                                          " but uncompressed size " + std::to_string(e.uncompressed_size));
  return e;
}

// Walks the extra fields (id, length, data) and takes the values the sentinels defer to from
// the ZIP64 one. Fields appear in a fixed order and only when their header field is a sentinel.
void Parser::ApplyZip64Extra(const uint8_t* extra, uint64_t len, const Zip64Needs& needs, ZipEntry* e) const {
  bool found = false;
  uint64_t pos = 0;
  while (pos < len) {
    if (len - pos < 4) FailEntry(ErrorKind::kCorrupt, *e, "extra field area ends inside a field header");
    uint16_t id = Load16(extra + pos), field_len = Load16(extra + pos + 2);
    pos += 4;
    if (field_len > len - pos) FailEntry(ErrorKind::kCorrupt, *e, "extra field runs past the extra field area");
    if (id == kZip64ExtraId) {
      if (found) FailEntry(ErrorKind::kCorrupt, *e, "two ZIP64 extra fields");
      found = true;
      const uint8_t* p = extra + pos;
      uint64_t left = field_len;
      auto take64 = [&](bool needed, uint64_t* dst, const char* what) {
        if (!needed) return;
        if (left < 8) FailEntry(ErrorKind::kCorrupt, *e, std::string("ZIP64 extra field lacks the ") + what);
        *dst = Load64(p);
        p += 8;
        left -= 8;
      };
      take64(needs.uncompressed, &e->uncompressed_size, "uncompressed size");
      take64(needs.compressed, &e->compressed_size, "compressed size");
      take64(needs.local_offset, &e->local_header_offset, "local header offset");
      if (needs.disk) {
        if (left < 4) FailEntry(ErrorKind::kCorrupt, *e, "ZIP64 extra field lacks the disk number");
        if (Load32(p) != 0) FailEntry(ErrorKind::kUnsupported, *e, "entry starts on another disk");
      }
    }
    pos += field_len;
  }
  if (!found && (needs.uncompressed || needs.compressed || needs.local_offset || needs.disk))
    FailEntry(ErrorKind::kCorrupt, *e, "a size or offset is 0xFFFFFFFF but there is no ZIP64 extra field");
}

// The payload starts after the LOCAL header, whose extra field (torch's alignment padding) may
// differ from the central one; its sizes may be zero (flag 0x08): the central record is
// authoritative for sizes, the local one only for where the data begins.
void Parser::ReadLocalHeader(uint64_t cd_offset, ZipEntry* e) const {
  const uint64_t lho = e->local_header_offset;
  if (!Within(lho, kLocalHeaderSize, cd_offset))
    FailEntry(ErrorKind::kCorrupt, *e, "local header offset " + std::to_string(lho) +
                                           " is outside the payload area (central directory at byte " +
                                           std::to_string(cd_offset) + ")");
  const uint8_t* h = At(lho, kLocalHeaderSize);
  if (Load32(h) != kLocalHeaderSig)
    FailEntry(ErrorKind::kCorrupt, *e, "no local header signature at byte " + std::to_string(lho));
  const uint64_t name_len = Load16(h + kLocalNameLen), extra_len = Load16(h + kLocalExtraLen);
  const uint64_t header_len = kLocalHeaderSize + name_len + extra_len;
  if (!Within(lho, header_len, cd_offset))
    FailEntry(ErrorKind::kCorrupt, *e, "local header at byte " + std::to_string(lho) + " runs into the central directory");
  h = At(lho, header_len);
  if (name_len != e->name.size() || std::memcmp(h + kLocalHeaderSize, e->name.data(), name_len) != 0)
    FailEntry(ErrorKind::kCorrupt, *e, "local header at byte " + std::to_string(lho) + " names '" +
                                           PrintableEntryName(std::string_view(reinterpret_cast<const char*>(h + kLocalHeaderSize), name_len)) +
                                           "' instead");
  if (Load16(h + kLocalMethod) != e->method)
    FailEntry(ErrorKind::kCorrupt, *e, "local header at byte " + std::to_string(lho) + " gives another compression method");
  if (Load16(h + kLocalFlags) & (kFlagEncrypted | kFlagStrongEncryption))
    FailEntry(ErrorKind::kUnsupported, *e, "encrypted zip entries are not supported");
  e->data_offset = lho + header_len;
  if (!Within(e->data_offset, e->compressed_size, cd_offset))
    FailEntry(ErrorKind::kCorrupt, *e, "payload at byte " + std::to_string(e->data_offset) + " of " +
                                           std::to_string(e->compressed_size) +
                                           " bytes runs into the central directory at byte " + std::to_string(cd_offset));
}

// Names must be unique and free of NUL bytes (a second entry of the same name could shadow a
// storage; a NUL makes two readers see two names), and every
// entry's local header + payload must own its bytes: two entries sharing bytes is how a forged
// archive would make one tensor alias another.
void Parser::CheckUniqueAndDisjoint(const std::vector<ZipEntry>& entries,
                                    std::unordered_map<std::string, size_t>* by_name) const {
  by_name->reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    // A NUL ends the name for every C reader (torch's miniz included): two readers would disagree.
    if (entries[i].name.find('\0') != std::string::npos)
      FailEntry(ErrorKind::kCorrupt, entries[i], "entry name holds a NUL byte");
    if (!by_name->emplace(entries[i].name, i).second)
      FailEntry(ErrorKind::kCorrupt, entries[i], "duplicate entry name");
  }
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries[a].local_header_offset < entries[b].local_header_offset;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const ZipEntry& prev = entries[order[k - 1]];
    const ZipEntry& cur = entries[order[k]];
    uint64_t prev_end = prev.data_offset + prev.compressed_size;  // cannot overflow: <= cd_offset
    if (prev_end > cur.local_header_offset)
      FailEntry(ErrorKind::kCorrupt, cur, "local header at byte " + std::to_string(cur.local_header_offset) +
                                              " overlaps the payload of entry '" + PrintableEntryName(prev.name) +
                                              "' (bytes " + std::to_string(prev.local_header_offset) + ".." +
                                              std::to_string(prev_end) + ")");
  }
}

}  // namespace

std::string PrintableEntryName(std::string_view name) {
  std::string out;
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

ZipArchive::ZipArchive(std::shared_ptr<const MappedFile> file) : file_(std::move(file)) {
  if (!file_) throw Error(ErrorKind::kInvalidArgument, "ZipArchive: null mapping");
  Parser parser(*file_);
  EndRecords end = parser.ReadEndRecords();
  cd_offset_ = end.cd_offset;
  cd_size_ = end.cd_size;
  entries_ = parser.ReadCentralDirectory(end);
  parser.CheckUniqueAndDisjoint(entries_, &by_name_);
}

ZipArchive ZipArchive::Open(const std::string& path) {
  return ZipArchive(std::make_shared<const MappedFile>(path));
}

const ZipEntry* ZipArchive::Find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

std::span<const uint8_t> ZipArchive::Data(const ZipEntry& entry) const {
  if (entry.method != zipfmt::kMethodStored)
    throw Error(ErrorKind::kUnsupported, path() + ": zip entry '" + PrintableEntryName(entry.name) +
                                             "' is compressed (method " + std::to_string(entry.method) +
                                             "); only STORED entries can be read in place");
  if (entry.compressed_size == 0) return {};
  return {file_->data() + entry.data_offset, static_cast<size_t>(entry.compressed_size)};
}

CrcCheck ZipArchive::VerifyCrc(const ZipEntry& entry) const {
  std::span<const uint8_t> data = Data(entry);
  // zlib's length argument is 32-bit, and a pass over a multi-GiB storage should not leave it
  // all resident: go in chunks and drop each one's pages once hashed.
  constexpr size_t kChunk = size_t{64} << 20;
  file_->AdviseSequential(entry.data_offset, data.size());
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t done = 0; done < data.size();) {
    size_t n = std::min(kChunk, data.size() - done);
    crc = crc32(crc, data.data() + done, static_cast<uInt>(n));
    file_->Release(entry.data_offset + done, n);
    done += n;
  }
  CrcCheck check;
  check.recorded = entry.crc32;
  check.computed = static_cast<uint32_t>(crc);
  if (check.recorded == check.computed) {
    check.status = CrcCheck::Status::kMatch;
  } else if (check.recorded == 0) {
    check.status = CrcCheck::Status::kNotRecorded;
  } else {
    check.status = CrcCheck::Status::kMismatch;
  }
  return check;
}

}  // namespace zckpt::pt
