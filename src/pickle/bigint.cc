#include "pickle/bigint.h"

#include <algorithm>
#include <vector>

namespace zckpt::pickle {

namespace {

bool IsNegative(std::string_view le) { return !le.empty() && (static_cast<uint8_t>(le.back()) & 0x80); }

// Two's complement negation of a little-endian byte string: invert, add one.
void Negate(std::vector<uint8_t>& bytes) {
  unsigned carry = 1;
  for (uint8_t& b : bytes) {
    unsigned v = static_cast<uint8_t>(~b) + carry;
    b = static_cast<uint8_t>(v);
    carry = v >> 8;
  }
}

// Magnitude (little-endian, unsigned) of a two's complement payload.
std::vector<uint8_t> Magnitude(std::string_view le) {
  std::vector<uint8_t> mag(le.begin(), le.end());
  if (IsNegative(le)) Negate(mag);
  return mag;
}

bool IsZero(const std::vector<uint8_t>& mag) {
  return std::all_of(mag.begin(), mag.end(), [](uint8_t b) { return b == 0; });
}

// Divides the little-endian magnitude by 10 in place, returning the remainder.
unsigned DivMod10(std::vector<uint8_t>& mag) {
  unsigned rem = 0;
  for (size_t i = mag.size(); i-- > 0;) {
    unsigned cur = (rem << 8) | mag[i];
    mag[i] = static_cast<uint8_t>(cur / 10);
    rem = cur % 10;
  }
  return rem;
}

}  // namespace

std::optional<int64_t> BigIntToInt64(std::string_view le) {
  if (le.size() > 8) {
    // Still fits when every extra byte is pure sign extension.
    uint8_t fill = IsNegative(le) ? 0xFF : 0x00;
    for (size_t i = 8; i < le.size(); ++i)
      if (static_cast<uint8_t>(le[i]) != fill) return std::nullopt;
    if (((static_cast<uint8_t>(le[7]) & 0x80) != 0) != (fill == 0xFF)) return std::nullopt;
    le = le.substr(0, 8);
  }
  uint64_t u = IsNegative(le) ? ~uint64_t{0} : 0;
  for (size_t i = 0; i < le.size(); ++i) {
    u &= ~(uint64_t{0xFF} << (8 * i));
    u |= uint64_t{static_cast<uint8_t>(le[i])} << (8 * i);
  }
  return static_cast<int64_t>(u);
}

std::string BigIntToDecimal(std::string_view le) {
  if (le.size() > kMaxDecimalBytes) {
    std::string out(1, '<');
    return out.append(std::to_string(le.size())).append("-byte int>");
  }
  std::vector<uint8_t> mag = Magnitude(le);
  std::string digits;
  while (!IsZero(mag)) digits.push_back(static_cast<char>('0' + DivMod10(mag)));
  if (digits.empty()) digits.push_back('0');
  if (IsNegative(le)) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

std::optional<std::string> DecimalToBigInt(std::string_view text) {
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  std::vector<uint8_t> mag;  // little-endian magnitude
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    unsigned carry = static_cast<unsigned>(c - '0');
    for (uint8_t& b : mag) {
      unsigned v = b * 10u + carry;
      b = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
    if (carry) mag.push_back(static_cast<uint8_t>(carry));
  }
  while (!mag.empty() && mag.back() == 0) mag.pop_back();
  // Room for the sign bit.
  if (!mag.empty() && (mag.back() & 0x80)) mag.push_back(0);
  if (negative && !mag.empty()) {
    Negate(mag);
    // -2^(8k-1) needs no extra byte: drop a redundant 0xFF sign byte.
    if (mag.size() >= 2 && mag.back() == 0xFF && (mag[mag.size() - 2] & 0x80)) mag.pop_back();
  }
  return std::string(mag.begin(), mag.end());
}

}  // namespace zckpt::pickle
