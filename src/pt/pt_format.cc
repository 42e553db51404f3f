#include "pt/pt_format.h"

#include <cstring>

namespace zckpt::pt {

namespace {

constexpr uint8_t kZipMagic[] = {'P', 'K', 0x03, 0x04};
// The legacy format opens with pickle.dump(MAGIC_NUMBER) where MAGIC_NUMBER is
// 0x1950a86a20f9469cfc6c: LONG1 (0x8a), 10 bytes, little-endian two's complement.
constexpr uint8_t kLegacyMagicLong[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
constexpr uint8_t kPickleProto = 0x80;
constexpr uint8_t kPickleFrame = 0x95;  // protocol 4+: FRAME + 8-byte length before the data
constexpr size_t kTarMagicOffset = 257;
constexpr char kTarMagic[] = "ustar";

bool HasAt(std::span<const uint8_t> head, size_t offset, const void* bytes, size_t n) {
  return head.size() >= offset + n && std::memcmp(head.data() + offset, bytes, n) == 0;
}

// torch's _legacy_save pickles with `pickle_protocol` (2 by default, up to 5).
bool IsLegacyPickle(std::span<const uint8_t> head) {
  if (head.size() < 2 || head[0] != kPickleProto || head[1] < 2 || head[1] > 5) return false;
  size_t pos = 2;
  if (head[1] >= 4 && head.size() > pos && head[pos] == kPickleFrame) pos += 9;
  return HasAt(head, pos, kLegacyMagicLong, sizeof kLegacyMagicLong);
}

}  // namespace

const char* PtFormatName(PtFormat format) {
  switch (format) {
    case PtFormat::kUnknown: return "unknown";
    case PtFormat::kZip: return "zip";
    case PtFormat::kLegacy: return "legacy";
    case PtFormat::kLegacyTar: return "legacy-tar";
  }
  return "unknown";
}

PtFormat DetectPtFormat(std::span<const uint8_t> head) {
  if (HasAt(head, 0, kZipMagic, sizeof kZipMagic)) return PtFormat::kZip;
  if (IsLegacyPickle(head)) return PtFormat::kLegacy;
  if (HasAt(head, kTarMagicOffset, kTarMagic, sizeof kTarMagic - 1)) return PtFormat::kLegacyTar;
  return PtFormat::kUnknown;
}

}  // namespace zckpt::pt
