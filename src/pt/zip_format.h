// The zip records a torch `.pt` archive is made of: signatures, fixed sizes, field offsets and
// little-endian byte access, shared by the reader (zip_reader.cc) and the record encoders
// (zip_records.cc) so both sides agree on one description of the layout (PKWARE APPNOTE 6.3).
#pragma once

#include <cstdint>
#include <string>

namespace zckpt::pt::zipfmt {

// Record signatures ("PK" + two bytes), as little-endian 32-bit words.
inline constexpr uint32_t kLocalHeaderSig = 0x04034b50;
inline constexpr uint32_t kDataDescriptorSig = 0x08074b50;
inline constexpr uint32_t kCentralHeaderSig = 0x02014b50;
inline constexpr uint32_t kZip64EndSig = 0x06064b50;
inline constexpr uint32_t kZip64LocatorSig = 0x07064b50;
inline constexpr uint32_t kEndSig = 0x06054b50;

// Fixed parts of each record (variable name/extra/comment bytes follow).
inline constexpr uint64_t kLocalHeaderSize = 30;
inline constexpr uint64_t kCentralHeaderSize = 46;
inline constexpr uint64_t kZip64EndSize = 56;  // including signature and the size field
inline constexpr uint64_t kZip64LocatorSize = 20;
inline constexpr uint64_t kEndSize = 22;
inline constexpr uint64_t kDataDescriptorSize32 = 16;
inline constexpr uint64_t kDataDescriptorSize64 = 24;
inline constexpr uint64_t kMaxCommentSize = 0xFFFF;

// Local file header field offsets.
inline constexpr size_t kLocalFlags = 6;
inline constexpr size_t kLocalMethod = 8;
inline constexpr size_t kLocalNameLen = 26;
inline constexpr size_t kLocalExtraLen = 28;

// Central directory header field offsets.
inline constexpr size_t kCentralFlags = 8;
inline constexpr size_t kCentralMethod = 10;
inline constexpr size_t kCentralCrc = 16;
inline constexpr size_t kCentralCompressedSize = 20;
inline constexpr size_t kCentralUncompressedSize = 24;
inline constexpr size_t kCentralNameLen = 28;
inline constexpr size_t kCentralExtraLen = 30;
inline constexpr size_t kCentralCommentLen = 32;
inline constexpr size_t kCentralDiskStart = 34;
inline constexpr size_t kCentralLocalOffset = 42;

// End of central directory record field offsets.
inline constexpr size_t kEndDisk = 4;
inline constexpr size_t kEndCdDisk = 6;
inline constexpr size_t kEndDiskEntries = 8;
inline constexpr size_t kEndTotalEntries = 10;
inline constexpr size_t kEndCdSize = 12;
inline constexpr size_t kEndCdOffset = 16;
inline constexpr size_t kEndCommentLen = 20;

// ZIP64 end of central directory record field offsets.
inline constexpr size_t kZip64EndRecordSize = 4;  // size of the rest of the record (u64)
inline constexpr size_t kZip64EndDisk = 16;
inline constexpr size_t kZip64EndCdDisk = 20;
inline constexpr size_t kZip64EndDiskEntries = 24;
inline constexpr size_t kZip64EndTotalEntries = 32;
inline constexpr size_t kZip64EndCdSize = 40;
inline constexpr size_t kZip64EndCdOffset = 48;

// ZIP64 end of central directory locator field offsets.
inline constexpr size_t kLocatorDisk = 4;
inline constexpr size_t kLocatorZip64EndOffset = 8;
inline constexpr size_t kLocatorTotalDisks = 16;

// General purpose flag bits.
inline constexpr uint16_t kFlagEncrypted = 0x0001;
inline constexpr uint16_t kFlagDataDescriptor = 0x0008;
inline constexpr uint16_t kFlagStrongEncryption = 0x0040;
inline constexpr uint16_t kFlagUtf8 = 0x0800;
inline constexpr uint16_t kFlagMaskedHeaders = 0x2000;  // central directory encryption

inline constexpr uint16_t kMethodStored = 0;

// A 32-bit (16-bit) field holding this value defers to the ZIP64 extra field / ZIP64 record.
inline constexpr uint32_t kSentinel32 = 0xFFFFFFFF;
inline constexpr uint16_t kSentinel16 = 0xFFFF;

// Extra field ids: ZIP64 extended information, and torch's alignment padding ("FB").
inline constexpr uint16_t kZip64ExtraId = 0x0001;
inline constexpr uint16_t kTorchPaddingExtraId = 'F' | ('B' << 8);
// torch's writer puts every payload on a multiple of this (caffe2 kFieldAlignment).
inline constexpr uint64_t kTorchAlignment = 64;

inline uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t Load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
inline uint64_t Load64(const uint8_t* p) {
  return static_cast<uint64_t>(Load32(p)) | (static_cast<uint64_t>(Load32(p + 4)) << 32);
}

inline void Append16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>(v >> 8));
}
inline void Append32(std::string& out, uint32_t v) {
  Append16(out, static_cast<uint16_t>(v & 0xFFFF));
  Append16(out, static_cast<uint16_t>(v >> 16));
}
inline void Append64(std::string& out, uint64_t v) {
  Append32(out, static_cast<uint32_t>(v & 0xFFFFFFFF));
  Append32(out, static_cast<uint32_t>(v >> 32));
}

}  // namespace zckpt::pt::zipfmt
