#include "pickle/json_writer.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "zckpt/text.h"

namespace zckpt {

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  char buf[8];
  ForEachUtf8(
      s,
      [&](uint32_t cp, std::string_view bytes) {
        if (cp == '"') out += "\\\"";
        else if (cp == '\\') out += "\\\\";
        else if (cp == '\n') out += "\\n";
        else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F)) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));  // C0, DEL, C1 controls
          out += buf;
        } else {
          out.append(bytes);  // valid UTF-8 passes through
        }
      },
      [&](uint8_t byte) {
        // Not UTF-8 (names are bytes in a file): the byte as a lone low surrogate U+DC80-U+DCFF,
        // Python's "surrogateescape" (json.loads(...).encode("utf-8", "surrogateescape") gives
        // the bytes back). Valid JSON text; no valid UTF-8 decodes to a lone surrogate, so it is
        // unambiguous.
        std::snprintf(buf, sizeof buf, "\\udc%02x", byte);
        out += buf;
      });
  return out + "\"";
}

}  // namespace zckpt

namespace zckpt::pickle {

std::string JsonIntList(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(v[i]);
  }
  return out + "]";
}

std::string JsonStringList(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += JsonString(v[i]);
  }
  return out + "]";
}

std::string JsonNumber(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, res.ptr);
}

}  // namespace zckpt::pickle
