#include "pt/zip_writer.h"

#include <zlib.h>

#include <algorithm>

#include "pt/zip_format.h"
#include "pt/zip_records.h"
#include "zckpt/error.h"

namespace zckpt::pt {

namespace {

[[noreturn]] void Misuse(const std::string& destination, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, "TorchZipWriter(" + destination + "): " + what);
}

const std::string& CheckedPrefix(const std::string& prefix, const std::string& destination) {
  if (prefix.empty() || prefix.find('/') != std::string::npos)
    Misuse(destination, "invalid record prefix '" + prefix + "' (must be non-empty, without '/')");
  return prefix;
}

uint32_t Crc32Update(uint32_t crc, std::span<const uint8_t> data) {
  // zlib takes 32-bit lengths.
  constexpr size_t kMaxPiece = size_t{1} << 30;
  uLong c = crc;
  for (size_t done = 0; done < data.size();) {
    size_t n = std::min(kMaxPiece, data.size() - done);
    c = crc32(c, data.data() + done, static_cast<uInt>(n));
    done += n;
  }
  return static_cast<uint32_t>(c);
}

}  // namespace

TorchZipWriter::TorchZipWriter(const std::string& destination, const std::string& prefix)
    : prefix_(CheckedPrefix(prefix, destination)), file_(destination) {}

template <typename F>
void TorchZipWriter::Guarded(std::string_view what, F&& write) {
  try {
    write();
  } catch (const Error& e) {
    failed_ = true;
    file_.Abort();
    if (e.kind() != ErrorKind::kIo) throw;
    throw Error(ErrorKind::kIo, "writing .pt archive " + std::string(what) + ": " + e.what());
  }
}

void TorchZipWriter::CheckUsable(const char* call) const {
  if (failed_) Misuse(file_.destination(), std::string(call) + " after a failed write");
  if (committed_) Misuse(file_.destination(), std::string(call) + " after Commit");
}

void TorchZipWriter::CheckRecordClosed(const char* call) const {
  if (in_record_)
    Misuse(file_.destination(), std::string(call) + " while record '" + open_.full_name + "' is still open (" +
                                    std::to_string(open_.written) + " of " + std::to_string(open_.size) +
                                    " bytes written)");
}

void TorchZipWriter::WriteRecord(std::string_view name, std::span<const uint8_t> data) {
  BeginRecord(name, data.size());
  Append(data);
  EndRecord();
}

void TorchZipWriter::BeginRecord(std::string_view name, uint64_t size) {
  CheckUsable("BeginRecord");
  CheckRecordClosed("BeginRecord");
  if (name.empty()) Misuse(file_.destination(), "empty record name");
  std::string full_name = prefix_ + "/" + std::string(name);
  if (full_name.size() > zipfmt::kSentinel16) Misuse(file_.destination(), "record name too long: " + full_name);
  if (names_.count(full_name)) Misuse(file_.destination(), "record '" + std::string(name) + "' written twice");

  open_ = Open{full_name, size, 0, file_.position(), static_cast<uint32_t>(crc32(0L, Z_NULL, 0))};
  Guarded("record '" + full_name + "'", [&] {
    std::string header = EncodeLocalHeader(full_name, size, open_.local_header_offset);
    file_.Write(header.data(), header.size());
  });
  names_.insert(std::move(full_name));
  in_record_ = true;
}

void TorchZipWriter::Append(std::span<const uint8_t> piece) {
  CheckUsable("Append");
  if (!in_record_) Misuse(file_.destination(), "Append outside BeginRecord/EndRecord");
  if (piece.size() > open_.size - open_.written)
    Misuse(file_.destination(), "record '" + open_.full_name + "' declared " + std::to_string(open_.size) +
                                    " bytes; appending " + std::to_string(piece.size()) + " more after " +
                                    std::to_string(open_.written) + " exceeds it");
  if (piece.empty()) return;
  Guarded("record '" + open_.full_name + "'", [&] { file_.Write(piece.data(), piece.size()); });
  open_.crc = Crc32Update(open_.crc, piece);
  open_.written += piece.size();
}

void TorchZipWriter::EndRecord() {
  CheckUsable("EndRecord");
  if (!in_record_) Misuse(file_.destination(), "EndRecord without BeginRecord");
  if (open_.written != open_.size)
    Misuse(file_.destination(), "record '" + open_.full_name + "' declared " + std::to_string(open_.size) +
                                    " bytes but got " + std::to_string(open_.written));
  StoredEntryInfo info{open_.full_name, open_.size, open_.crc, open_.local_header_offset};
  Guarded("record '" + open_.full_name + "'", [&] {
    std::string descriptor = EncodeDataDescriptor(info);
    file_.Write(descriptor.data(), descriptor.size());
  });
  central_directory_ += EncodeCentralRecord(info);
  ++records_;
  in_record_ = false;
}

void TorchZipWriter::Commit() {
  CheckUsable("Commit");
  CheckRecordClosed("Commit");
  Guarded("central directory", [&] {
    const uint64_t cd_offset = file_.position();
    file_.Write(central_directory_.data(), central_directory_.size());
    std::string end = EncodeEndRecords(records_, cd_offset, central_directory_.size());
    file_.Write(end.data(), end.size());
    file_.Commit();
  });
  committed_ = true;
}

}  // namespace zckpt::pt
