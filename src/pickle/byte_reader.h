// Bounds-checked reads from a byte span. Every read says whether the bytes were there; the
// caller turns a miss into an error that names its opcode.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace zckpt::pickle {

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  bool AtEnd() const { return pos_ == bytes_.size(); }

  std::optional<uint8_t> U8() {
    if (remaining() < 1) return std::nullopt;
    return bytes_[pos_++];
  }

  // `n` (1..8) bytes as an unsigned little-endian number.
  std::optional<uint64_t> LittleEndian(unsigned n) {
    if (remaining() < n) return std::nullopt;
    uint64_t v = 0;
    for (unsigned i = 0; i < n; ++i) v |= uint64_t{bytes_[pos_ + i]} << (8 * i);
    pos_ += n;
    return v;
  }

  // `n` (1..8) bytes as an unsigned big-endian number (BINFLOAT).
  std::optional<uint64_t> BigEndian(unsigned n) {
    if (remaining() < n) return std::nullopt;
    uint64_t v = 0;
    for (unsigned i = 0; i < n; ++i) v = (v << 8) | bytes_[pos_ + i];
    pos_ += n;
    return v;
  }

  // The next `n` bytes; compared with what is left before anything is touched, so a length
  // claim of 2^64-1 is just a miss.
  std::optional<std::string_view> Take(uint64_t n) {
    if (n > remaining()) return std::nullopt;
    std::string_view s(reinterpret_cast<const char*>(bytes_.data()) + pos_, static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

  // Bytes up to the next '\n' (not included; the newline is consumed).
  std::optional<std::string_view> Line() {
    for (uint64_t i = pos_; i < bytes_.size(); ++i) {
      if (bytes_[i] == '\n') {
        std::string_view s(reinterpret_cast<const char*>(bytes_.data()) + pos_, static_cast<size_t>(i - pos_));
        pos_ = i + 1;
        return s;
      }
    }
    return std::nullopt;
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

}  // namespace zckpt::pickle
