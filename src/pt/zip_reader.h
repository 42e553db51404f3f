// A strict zip reader over a read-only memory mapping, for torch's `.pt` archives.
//
// Why our own central-directory reader rather than LibTorch's PyTorchStreamReader:
//  - strictness: a checkpoint is untrusted input. Every offset, size and count is validated
//    (overflow-safe, in bounds, no overlaps, unique names) before anything is used, the way a
//    safetensors header is, so a forged archive fails with kCorrupt instead of reading out of
//    bounds or aliasing one payload into another;
//  - fuzzable on its own: it needs no LibTorch, so a fuzzer links only this layer;
//  - it keeps the converter (.pt <-> .zckpt) free of torch;
//  - it gives payload offsets into *our* mapping, so storages are used in place (zero-copy) and
//    a 34 GiB shard is readable with less RAM than that. LibTorch's getRecord copies into a
//    fresh buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mapped_file.h"

namespace zckpt::pt {

// One entry of the central directory, validated against its local header.
struct ZipEntry {
  std::string name;             // raw bytes of the name (UTF-8 when flags has 0x0800)
  uint16_t method = 0;          // 0 = STORED; anything else is refused by Data()
  uint16_t flags = 0;           // general purpose bits
  uint32_t crc32 = 0;           // as recorded; 0 on non-empty data means "not computed"
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint64_t local_header_offset = 0;
  uint64_t data_offset = 0;     // first payload byte: local header + 30 + name + local extra
  uint64_t central_offset = 0;  // where this entry's central directory record starts
};

// Result of checking a payload against its recorded CRC-32.
struct CrcCheck {
  enum class Status {
    kMatch,
    kMismatch,
    kNotRecorded,  // CRC field 0 on non-empty data: torch was told to skip the CRC
  };
  Status status = Status::kMatch;
  uint32_t recorded = 0;
  uint32_t computed = 0;
  bool ok() const { return status != Status::kMismatch; }
};

// An entry name as it may appear in a message: control bytes escaped as \xNN (names come from
// untrusted files).
std::string PrintableEntryName(std::string_view name);

class ZipArchive {
 public:
  // Parses and validates the whole central directory. Throws zckpt::Error:
  //   kNotContainer  no end-of-central-directory record and the file does not start like a zip
  //   kCorrupt       anything malformed (message: path, entry name, byte offset)
  //   kUnsupported   encryption, multi-disk archives
  explicit ZipArchive(std::shared_ptr<const MappedFile> file);
  // Maps `path` and opens it.
  static ZipArchive Open(const std::string& path);

  // Entries in central directory order.
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // The entry with exactly this name, or nullptr.
  const ZipEntry* Find(std::string_view name) const;
  // The payload as a view into the mapping (valid while the mapping lives). Throws
  // kUnsupported naming the entry when it is not STORED.
  std::span<const uint8_t> Data(const ZipEntry& entry) const;
  // Computes the payload's CRC-32 (zlib) and compares it with the recorded one.
  CrcCheck VerifyCrc(const ZipEntry& entry) const;

  const std::string& path() const { return file_->path(); }
  const std::shared_ptr<const MappedFile>& file() const { return file_; }
  uint64_t central_directory_offset() const { return cd_offset_; }
  uint64_t central_directory_size() const { return cd_size_; }

 private:
  std::shared_ptr<const MappedFile> file_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> by_name_;  // name -> index in entries_
  uint64_t cd_offset_ = 0;
  uint64_t cd_size_ = 0;
};

}  // namespace zckpt::pt
