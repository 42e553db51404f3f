#include "pickle/json_writer.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace zckpt::pickle {

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(ch);  // UTF-8 passes through
    }
  }
  return out + "\"";
}

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
