#include "pickle/text_codec.h"

#include <charconv>
#include <limits>

namespace zckpt::pickle {

namespace {

bool IsCont(uint8_t b) { return (b & 0xC0) == 0x80; }

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads exactly `count` hex digits at s[*i]; advances *i.
std::optional<uint32_t> ReadHex(std::string_view s, size_t* i, int count) {
  if (s.size() - *i < static_cast<size_t>(count)) return std::nullopt;
  uint32_t v = 0;
  for (int k = 0; k < count; ++k) {
    int d = HexDigit(s[*i + k]);
    if (d < 0) return std::nullopt;
    v = v * 16 + static_cast<uint32_t>(d);
  }
  *i += static_cast<size_t>(count);
  return v;
}

std::string_view StripSpaces(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    uint8_t b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) { ++i; continue; }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; if (b == 0xE0) lo = 0xA0; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
    else return false;
    if (n - i < len) return false;
    uint8_t b1 = static_cast<uint8_t>(s[i + 1]);
    if (b1 < lo || b1 > hi) return false;
    for (size_t k = 2; k < len; ++k)
      if (!IsCont(static_cast<uint8_t>(s[i + k]))) return false;
    i += len;
  }
  return true;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::optional<std::string> Utf8ToLatin1(std::string_view utf8) {
  if (!IsValidUtf8(utf8)) return std::nullopt;
  std::string out;
  out.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) {
    uint8_t b = static_cast<uint8_t>(utf8[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
    } else if (b == 0xC2 || b == 0xC3) {  // U+0080..U+00FF
      out.push_back(static_cast<char>(((b & 0x1F) << 6) | (static_cast<uint8_t>(utf8[i + 1]) & 0x3F)));
      i += 2;
    } else {
      return std::nullopt;  // a code point above 0xFF has no latin-1 byte
    }
  }
  return out;
}

std::string Latin1ToUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (char c : bytes) AppendUtf8(out, static_cast<uint8_t>(c));
  return out;
}

std::optional<std::string> DecodeStringLine(std::string_view line, std::string* why) {
  if (line.size() < 2 || line.front() != line.back() || (line.front() != '\'' && line.front() != '"')) {
    *why = "the STRING opcode argument must be quoted";
    return std::nullopt;
  }
  std::string_view s = line.substr(1, line.size() - 2);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char c = s[i++];
    if (c != '\\') { out.push_back(c); continue; }
    if (i == s.size()) { *why = "STRING ends with a lone backslash"; return std::nullopt; }
    char e = s[i++];
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': {
        auto v = ReadHex(s, &i, 2);
        if (!v) { *why = "invalid \\x escape in STRING"; return std::nullopt; }
        out.push_back(static_cast<char>(*v));
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          unsigned v = static_cast<unsigned>(e - '0');
          for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k)
            v = v * 8 + static_cast<unsigned>(s[i++] - '0');
          out.push_back(static_cast<char>(v & 0xFF));
        } else {
          out.push_back('\\');  // unknown escapes stay as written
          out.push_back(e);
        }
    }
  }
  return out;
}

std::optional<std::string> DecodeRawUnicodeEscape(std::string_view s, std::string* why) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '\\') {
      AppendUtf8(out, static_cast<uint8_t>(s[i++]));
      continue;
    }
    // Only an odd run of backslashes escapes the \u or \U after it.
    size_t run = 0;
    while (i < s.size() && s[i] == '\\') { out.push_back('\\'); ++i; ++run; }
    if (run % 2 == 0 || i == s.size() || (s[i] != 'u' && s[i] != 'U')) continue;
    out.pop_back();
    int digits = s[i] == 'u' ? 4 : 8;
    ++i;
    auto cp = ReadHex(s, &i, digits);
    if (!cp) { *why = "truncated \\uXXXX escape in UNICODE"; return std::nullopt; }
    if (*cp > 0x10FFFF) { *why = "\\Uxxxxxxxx out of range in UNICODE"; return std::nullopt; }
    AppendUtf8(out, *cp);
  }
  return out;
}

std::optional<int64_t> ParseDecimalInt64(std::string_view text) {
  text = StripSpaces(text);
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  if (text.empty() || text[0] == '+') return std::nullopt;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<double> ParseFloatText(std::string_view text) {
  text = StripSpaces(text);
  bool negative = false;
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty() || text[0] == '+' || text[0] == '-') return std::nullopt;
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (end != text.data() + text.size()) return std::nullopt;
  if (ec == std::errc::result_out_of_range) {
    // Python's float() rounds to inf or 0 rather than failing.
    size_t e = text.find_first_of("eE");
    bool tiny = e != std::string_view::npos && e + 1 < text.size() && text[e + 1] == '-';
    v = tiny ? 0.0 : std::numeric_limits<double>::infinity();
  } else if (ec != std::errc()) {
    return std::nullopt;
  }
  return negative ? -v : v;
}

}  // namespace zckpt::pickle
