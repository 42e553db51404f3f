#include "pt/zip_records.h"

#include <algorithm>

#include "pt/zip_format.h"

namespace zckpt::pt {

namespace {

using namespace zipfmt;

// Fields miniz writes as zero: versions (0 = STORED needs nothing), DOS time and date (torch
// builds miniz with MINIZ_NO_TIME), attributes. Kept zero so our output is byte-identical to
// torch.save's for the same records.
constexpr uint16_t kVersion = 0;
constexpr uint16_t kDosTime = 0;
constexpr uint16_t kDosDate = 0;
// miniz's ZIP64 end record says "made by Unix, 3.0" and "needs 4.5 (ZIP64)".
constexpr uint16_t kZip64EndMadeBy = 0x031E;
constexpr uint16_t kZip64EndNeeded = 0x002D;

uint16_t EntryFlags(uint64_t size) {
  // miniz sets the data-descriptor bit only when there is data to describe.
  return size > 0 ? (kFlagDataDescriptor | kFlagUtf8) : kFlagUtf8;
}

// The ZIP64 extended information field, with the values in the fixed order (uncompressed size,
// compressed size, local header offset), each present only when it does not fit in 32 bits.
// For a STORED entry the compressed size is `size`, except in the local header, where miniz
// writes it before compressing anything: 0 (readers take sizes from the central directory).
std::string Zip64Extra(uint64_t size, uint64_t compressed_size, uint64_t local_header_offset) {
  std::string values;
  if (size >= kSentinel32) {
    Append64(values, size);
    Append64(values, compressed_size);
  }
  if (local_header_offset >= kSentinel32) Append64(values, local_header_offset);
  if (values.empty()) return {};
  std::string field;
  Append16(field, kZip64ExtraId);
  Append16(field, static_cast<uint16_t>(values.size()));
  return field + values;
}

uint32_t Clamp32(uint64_t v) { return static_cast<uint32_t>(std::min<uint64_t>(v, kSentinel32)); }

}  // namespace

bool EntryNeedsZip64(uint64_t size, uint64_t local_header_offset) {
  return size >= kSentinel32 || local_header_offset >= kSentinel32;
}

std::string EncodeLocalHeader(std::string_view name, uint64_t size, uint64_t local_header_offset) {
  const std::string zip64 = Zip64Extra(size, 0, local_header_offset);
  // torch's getPadding: the payload would start after the header, the name, the ZIP64 field and
  // the 4-byte "FB" field header; pad with 'Z' up to the next multiple of 64.
  const uint64_t unpadded = local_header_offset + kLocalHeaderSize + name.size() + zip64.size() + 4;
  const uint64_t padding = (kTorchAlignment - unpadded % kTorchAlignment) % kTorchAlignment;

  std::string out;
  out.reserve(kLocalHeaderSize + name.size() + zip64.size() + 4 + padding);
  Append32(out, kLocalHeaderSig);
  Append16(out, kVersion);
  Append16(out, EntryFlags(size));
  Append16(out, kMethodStored);
  Append16(out, kDosTime);
  Append16(out, kDosDate);
  Append32(out, 0);  // CRC and sizes follow the payload, in the data descriptor
  Append32(out, 0);
  Append32(out, 0);
  Append16(out, static_cast<uint16_t>(name.size()));
  Append16(out, static_cast<uint16_t>(zip64.size() + 4 + padding));
  out.append(name);
  out += zip64;
  Append16(out, kTorchPaddingExtraId);
  Append16(out, static_cast<uint16_t>(padding));
  out.append(padding, 'Z');
  return out;
}

std::string EncodeDataDescriptor(const StoredEntryInfo& entry) {
  std::string out;
  if (entry.size == 0) return out;
  Append32(out, kDataDescriptorSig);
  Append32(out, entry.crc32);
  if (EntryNeedsZip64(entry.size, entry.local_header_offset)) {
    Append64(out, entry.size);
    Append64(out, entry.size);
  } else {
    Append32(out, static_cast<uint32_t>(entry.size));
    Append32(out, static_cast<uint32_t>(entry.size));
  }
  return out;
}

std::string EncodeCentralRecord(const StoredEntryInfo& entry) {
  const std::string zip64 = Zip64Extra(entry.size, entry.size, entry.local_header_offset);
  std::string out;
  out.reserve(kCentralHeaderSize + entry.name.size() + zip64.size());
  Append32(out, kCentralHeaderSig);
  Append16(out, kVersion);  // made by
  Append16(out, kVersion);  // needed
  Append16(out, EntryFlags(entry.size));
  Append16(out, kMethodStored);
  Append16(out, kDosTime);
  Append16(out, kDosDate);
  Append32(out, entry.crc32);
  Append32(out, Clamp32(entry.size));  // compressed
  Append32(out, Clamp32(entry.size));  // uncompressed
  Append16(out, static_cast<uint16_t>(entry.name.size()));
  Append16(out, static_cast<uint16_t>(zip64.size()));
  Append16(out, 0);  // comment length
  Append16(out, 0);  // disk number start
  Append16(out, 0);  // internal attributes
  Append32(out, 0);  // external attributes
  Append32(out, Clamp32(entry.local_header_offset));
  out.append(entry.name);
  out += zip64;
  return out;
}

std::string EncodeEndRecords(uint64_t entries, uint64_t cd_offset, uint64_t cd_size) {
  std::string out;
  const uint64_t zip64_end_offset = cd_offset + cd_size;
  Append32(out, kZip64EndSig);
  Append64(out, kZip64EndSize - 12);  // size of the rest of the record
  Append16(out, kZip64EndMadeBy);
  Append16(out, kZip64EndNeeded);
  Append32(out, 0);  // this disk
  Append32(out, 0);  // disk with the central directory
  Append64(out, entries);
  Append64(out, entries);
  Append64(out, cd_size);
  Append64(out, cd_offset);

  Append32(out, kZip64LocatorSig);
  Append32(out, 0);  // disk with the ZIP64 end record
  Append64(out, zip64_end_offset);
  Append32(out, 1);  // total disks

  Append32(out, kEndSig);
  Append16(out, 0);
  Append16(out, 0);
  Append16(out, static_cast<uint16_t>(std::min<uint64_t>(entries, kSentinel16)));
  Append16(out, static_cast<uint16_t>(std::min<uint64_t>(entries, kSentinel16)));
  Append32(out, Clamp32(cd_size));
  Append32(out, Clamp32(cd_offset));
  Append16(out, 0);  // comment length
  return out;
}

}  // namespace zckpt::pt
