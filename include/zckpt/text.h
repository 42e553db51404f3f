// Showing and serializing names taken from a file: strict UTF-8 decoding (RFC 3629) and JSON
// strings. Those names are bytes, not necessarily UTF-8, and must never reach a JSON document or
// a terminal unescaped; every JSON zckpt writes escapes them by one rule (JsonString).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zckpt {

// Decodes the UTF-8 sequence starting at s[i]: its length (1-4) with the code point in *cp, or 0
// when s[i] does not start a valid sequence (a stray continuation byte, a truncated sequence, an
// overlong form, a surrogate, a code point above U+10FFFF).
inline size_t DecodeUtf8(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t n;
  uint32_t v, min;
  if ((c & 0xE0) == 0xC0) n = 2, v = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) n = 3, v = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) n = 4, v = c & 0x07, min = 0x10000;
  else return 0;
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    v = v << 6 | (b(k) & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// Walks `s`: valid(code_point, its bytes) for each valid sequence, invalid(byte) for each byte
// that starts none (it is then skipped alone).
template <typename Valid, typename Invalid>
void ForEachUtf8(std::string_view s, Valid valid, Invalid invalid) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t n = DecodeUtf8(s, i, &cp);
    if (n == 0) {
      invalid(static_cast<uint8_t>(s[i]));
      ++i;
    } else {
      valid(cp, s.substr(i, n));
      i += n;
    }
  }
}

// `s` as a JSON string, quotes included: valid UTF-8 as is (quote, backslash and control
// characters escaped), each byte of an invalid sequence as the lone surrogate U+DC80 + byte
// (Python's "surrogateescape": json.loads(...).encode("utf-8", "surrogateescape") gives it back).
std::string JsonString(std::string_view s);

}  // namespace zckpt
