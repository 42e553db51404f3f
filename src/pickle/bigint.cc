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

// 64-bit limbs, least significant first: 19 decimal digits per multiply or divide step.
using Limbs = std::vector<uint64_t>;
constexpr uint64_t kTen19 = 10000000000000000000ull;

Limbs ToLimbs(const std::vector<uint8_t>& mag) {
  Limbs limbs((mag.size() + 7) / 8, 0);
  for (size_t i = 0; i < mag.size(); ++i) limbs[i / 8] |= uint64_t{mag[i]} << (8 * (i % 8));
  while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
  return limbs;
}

std::vector<uint8_t> FromLimbs(const Limbs& limbs) {
  std::vector<uint8_t> mag(limbs.size() * 8);
  for (size_t i = 0; i < mag.size(); ++i) mag[i] = static_cast<uint8_t>(limbs[i / 8] >> (8 * (i % 8)));
  while (!mag.empty() && mag.back() == 0) mag.pop_back();
  return mag;
}

// limbs = limbs * factor + add.
void MulAdd(Limbs& limbs, uint64_t factor, uint64_t add) {
  unsigned __int128 carry = add;
  for (uint64_t& limb : limbs) {
    unsigned __int128 v = static_cast<unsigned __int128>(limb) * factor + carry;
    limb = static_cast<uint64_t>(v);
    carry = v >> 64;
  }
  if (carry) limbs.push_back(static_cast<uint64_t>(carry));
}

// limbs /= divisor, returning the remainder; drops leading zero limbs.
uint64_t DivMod(Limbs& limbs, uint64_t divisor) {
  unsigned __int128 rem = 0;
  for (size_t i = limbs.size(); i-- > 0;) {
    unsigned __int128 cur = (rem << 64) | limbs[i];
    limbs[i] = static_cast<uint64_t>(cur / divisor);
    rem = cur % divisor;
  }
  while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
  return static_cast<uint64_t>(rem);
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
  Limbs limbs = ToLimbs(Magnitude(le));
  std::string digits;  // reversed
  while (!limbs.empty()) {
    uint64_t chunk = DivMod(limbs, kTen19);
    for (int k = 0; k < 19 && (chunk || !limbs.empty()); ++k, chunk /= 10) digits.push_back(static_cast<char>('0' + chunk % 10));
  }
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
  for (char c : text)
    if (c < '0' || c > '9') return std::nullopt;
  Limbs limbs;
  // The first group takes the odd digits, every later one 19.
  size_t group = text.size() % 19 ? text.size() % 19 : 19;
  for (size_t at = 0; at < text.size(); at += group, group = 19) {
    uint64_t value = 0, factor = 1;
    for (char c : text.substr(at, group)) {
      value = value * 10 + static_cast<uint64_t>(c - '0');
      factor *= 10;
    }
    MulAdd(limbs, factor, value);
  }
  std::vector<uint8_t> mag = FromLimbs(limbs);
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
