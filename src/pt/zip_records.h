// Byte-exact encoders for the zip records torch's writer (caffe2 PyTorchStreamWriter over
// miniz, in ZIP64 mode) emits for a STORED entry. Pure functions of (name, size, crc, offset),
// kept apart from TorchZipWriter so the >4 GiB layouts (ZIP64 extra fields, 24-byte data
// descriptors) can be tested by building sparse archives without writing gigabytes.
//
// Per entry, at `offset`:
//   local header  version 0, flags 0x0808 (0x0800 when empty), time/date/CRC/sizes 0, then the
//                 name, then a ZIP64 extra field when size or offset >= 0xFFFFFFFF (sizes
//                 `size` and 0, as miniz writes them before compressing; offset), then torch's
//                 "FB" padding extra field that puts the payload on a 64-byte boundary
//   payload       `size` bytes
//   descriptor    PK\7\8, CRC, sizes (8-byte sizes when the local header had a ZIP64 field);
//                 absent for empty entries
// and at the end: central directory (no padding; ZIP64 extra when needed), ZIP64 end record,
// ZIP64 locator, end record.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zckpt::pt {

struct StoredEntryInfo {
  std::string_view name;  // full name, prefix included
  uint64_t size = 0;
  uint32_t crc32 = 0;
  uint64_t local_header_offset = 0;
};

// miniz gives an entry ZIP64 extra fields when its size or its header offset reaches 2^32-1.
bool EntryNeedsZip64(uint64_t size, uint64_t local_header_offset);
// Local header + name + extra fields; the payload starts right after, 64-byte aligned.
std::string EncodeLocalHeader(std::string_view name, uint64_t size, uint64_t local_header_offset);
// The data descriptor that follows the payload ("" for an empty entry, which has none).
std::string EncodeDataDescriptor(const StoredEntryInfo& entry);
std::string EncodeCentralRecord(const StoredEntryInfo& entry);
// ZIP64 end record + ZIP64 locator + end record, for a central directory at cd_offset.
std::string EncodeEndRecords(uint64_t entries, uint64_t cd_offset, uint64_t cd_size);

}  // namespace zckpt::pt
