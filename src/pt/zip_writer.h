// Writes a torch.save-compatible zip archive: the layout of caffe2's PyTorchStreamWriter (STORED
// entries under one prefix folder, payloads 64-byte aligned by an "FB" padding extra field, CRC
// in a data descriptor, ZIP64 end records), byte-identical to what torch writes for the same
// records in the same order. torch.load, Python's zipfile and ZipArchive read it.
//
// The file goes through AtomicFile: nothing appears at the destination until Commit(), and a
// writer destroyed uncommitted, or one whose write failed, leaves no temporary file behind.
// Which records to write, and in which order (torch.save: data.pkl first), is the caller's
// business.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>

#include "common/atomic_file.h"

namespace zckpt::pt {

class TorchZipWriter {
 public:
  // `prefix` is the folder every record lives in: torch uses the destination's base name
  // without extension, or "archive" for buffers and non-ASCII names. Throws kInvalidArgument
  // for an empty prefix or one with '/', kIo when the temporary file cannot be created.
  explicit TorchZipWriter(const std::string& destination, const std::string& prefix = "archive");
  ~TorchZipWriter() = default;
  TorchZipWriter(const TorchZipWriter&) = delete;
  TorchZipWriter& operator=(const TorchZipWriter&) = delete;

  // Writes a whole record named `name` (without the prefix, e.g. "data.pkl", "data/0").
  void WriteRecord(std::string_view name, std::span<const uint8_t> data);

  // Streams a record of exactly `size` bytes in pieces, so a multi-GiB storage never has to
  // be held in memory: BeginRecord, any number of Append, EndRecord.
  void BeginRecord(std::string_view name, uint64_t size);
  void Append(std::span<const uint8_t> piece);
  void EndRecord();

  // Writes the central directory and end records, then renames into place.
  void Commit();

  const std::string& prefix() const { return prefix_; }
  uint64_t records_written() const { return records_; }

  // Errors: kInvalidArgument for misuse (duplicate or empty name, Append past the declared
  // size, EndRecord short of it, a call after Commit or after a failure); kIo when a write
  // fails, after which the temporary file is already removed and the writer is unusable.

 private:
  struct Open {
    std::string full_name;
    uint64_t size = 0;
    uint64_t written = 0;
    uint64_t local_header_offset = 0;
    uint32_t crc = 0;
  };

  void CheckUsable(const char* call) const;
  void CheckRecordClosed(const char* call) const;
  // Runs a write; on kIo marks the writer failed, removes the temporary file and adds which
  // record was being written to the message.
  template <typename F>
  void Guarded(std::string_view what, F&& write);

  std::string prefix_;  // before file_: checked before a temporary file is created
  AtomicFile file_;
  std::string central_directory_;
  std::unordered_set<std::string> names_;
  uint64_t records_ = 0;
  bool in_record_ = false;
  bool failed_ = false;
  bool committed_ = false;
  Open open_;
};

}  // namespace zckpt::pt
