// A torch.save zip archive seen as torch sees it: records under one prefix folder.
//
//   <prefix>/data.pkl               the object pickle (required)
//   <prefix>/data/<key>             one storage's raw bytes per key the pickle references
//   <prefix>/byteorder              "little" / "big" (absent before torch 2.1: little)
//   <prefix>/.format_version, .storage_alignment, version, .data/serialization_id, ...
//
// Every record is kept, known or not, in archive order, so a converter can carry the
// non-storage ones along verbatim.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pt/pt_format.h"
#include "pt/zip_reader.h"

namespace zckpt::pt {

struct TorchRecord {
  std::string name;       // without the prefix: "data.pkl", "data/0", "byteorder", ...
  const ZipEntry* entry;  // owned by the archive's ZipArchive
};

class TorchArchive {
 public:
  // Opens a torch.save zip archive. Throws zckpt::Error:
  //   kNotContainer  not a .pt file at all (no known magic)
  //   kUnsupported   legacy (non-zip) or legacy tar format, TorchScript archives, big-endian
  //                  data, compressed records
  //   kCorrupt       malformed zip, entries outside one prefix folder, no data.pkl
  explicit TorchArchive(std::shared_ptr<const MappedFile> file);
  static TorchArchive Open(const std::string& path);
  // Records point into the ZipArchive's entries: movable (a vector's elements stay put),
  // not copyable.
  TorchArchive(TorchArchive&&) = default;
  TorchArchive& operator=(TorchArchive&&) = default;
  TorchArchive(const TorchArchive&) = delete;
  TorchArchive& operator=(const TorchArchive&) = delete;

  const std::string& prefix() const { return prefix_; }
  // All records in archive order.
  const std::vector<TorchRecord>& records() const { return records_; }
  std::vector<std::string> RecordNames() const;
  // The record with this name (prefix excluded), or nullptr.
  const TorchRecord* FindRecord(std::string_view name) const;
  // A record's bytes, a view into the mapping. Throws kCorrupt when absent (the pickle or the
  // caller expected it), kUnsupported when compressed.
  std::span<const uint8_t> Record(std::string_view name) const;
  // A record's bytes read privately (MappedFile::ReadView: a file that shrank is Error(kIo)
  // naming it): what a pickle or a kept record is parsed and written from, so the bytes checked
  // are the bytes used. Errors as Record otherwise.
  std::vector<uint8_t> RecordCopy(std::string_view name) const;
  // The bytes of storage `key`: record "data/<key>".
  std::span<const uint8_t> StorageRecord(std::string_view key) const;
  // True for "data/<key>" records (storages), false for metadata records.
  static bool IsStorageRecord(std::string_view name);

  bool little_endian() const { return little_endian_; }
  const ZipArchive& zip() const { return zip_; }
  const std::string& path() const { return zip_.path(); }

 private:
  void Validate();

  ZipArchive zip_;
  std::string prefix_;
  std::vector<TorchRecord> records_;
  std::unordered_map<std::string, size_t> by_name_;
  bool little_endian_ = true;
};

}  // namespace zckpt::pt
