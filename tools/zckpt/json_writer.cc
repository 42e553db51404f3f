#include "json_writer.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "cli.h"
#include "printable.h"
#include "zckpt/text.h"

namespace zckpt::cli {

// One escaping rule for every JSON zckpt writes (zckpt/text.h; tensors' `extra` too).
std::string JsonEscape(std::string_view s) { return JsonString(s); }

namespace {

// A recursive-descent check of RFC 8259's grammar (no values are built).
class JsonChecker {
 public:
  explicit JsonChecker(std::string_view s) : s_(s) {}
  bool Document() {
    Space();
    if (!Value(0)) return false;
    Space();
    return i_ == s_.size();
  }

 private:
  static constexpr int kMaxDepth = 64;
  bool More() const { return i_ < s_.size(); }
  char Peek() const { return More() ? s_[i_] : '\0'; }
  void Space() {
    while (More() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool Literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }
  bool Digits() {
    size_t start = i_;
    while (More() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    return i_ > start;
  }
  bool Number() {
    if (Peek() == '-') ++i_;
    if (Peek() == '0') ++i_;
    else if (!Digits()) return false;
    if (Peek() == '.' && (++i_, !Digits())) return false;
    if (Peek() == 'e' || Peek() == 'E') {
      ++i_;
      if (Peek() == '+' || Peek() == '-') ++i_;
      if (!Digits()) return false;
    }
    return true;
  }
  bool String() {
    ++i_;  // the opening quote
    while (More()) {
      uint32_t cp;
      size_t n = DecodeUtf8(s_, i_, &cp);
      if (n == 0 || cp < 0x20) return false;
      i_ += n;
      if (cp == '"') return true;
      if (cp != '\\') continue;
      char e = Peek();
      ++i_;
      if (e == 'u') {
        for (int k = 0; k < 4; ++k, ++i_)
          if (!More() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) return false;
      } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos || e == '\0') {
        return false;
      }
    }
    return false;
  }
  bool Value(int depth) {
    switch (Peek()) {
      case '{': return Container('}', depth, true);
      case '[': return Container(']', depth, false);
      case '"': return String();
      case 't': return Literal("true");
      case 'f': return Literal("false");
      case 'n': return Literal("null");
      default: return Number();
    }
  }
  bool Container(char close, int depth, bool object) {
    if (depth >= kMaxDepth) return false;
    ++i_;
    Space();
    if (Peek() == close) return ++i_, true;
    for (;;) {
      if (object) {
        if (Peek() != '"' || !String()) return false;
        Space();
        if (Peek() != ':') return false;
        ++i_;
        Space();
      }
      if (!Value(depth + 1)) return false;
      Space();
      if (Peek() == close) return ++i_, true;
      if (Peek() != ',') return false;
      ++i_;
      Space();
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

bool IsJson(std::string_view s) { return JsonChecker(s).Document(); }

void JsonWriter::Separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ",";
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::BeginObject() {
  Separate();
  out_ += "{";
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::EndObject() {
  out_ += "}";
  first_.pop_back();
  return *this;
}
JsonWriter& JsonWriter::BeginArray() {
  Separate();
  out_ += "[";
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::EndArray() {
  out_ += "]";
  first_.pop_back();
  return *this;
}
JsonWriter& JsonWriter::Key(std::string_view key) {
  Separate();
  out_ += JsonEscape(key) + ":";
  after_key_ = true;
  return *this;
}
JsonWriter& JsonWriter::String(std::string_view value) {
  Separate();
  out_ += JsonEscape(value);
  return *this;
}
JsonWriter& JsonWriter::Int(int64_t value) {
  Separate();
  out_ += std::to_string(value);
  return *this;
}
JsonWriter& JsonWriter::UInt(uint64_t value) {
  Separate();
  out_ += std::to_string(value);
  return *this;
}
JsonWriter& JsonWriter::Double(double value) {
  Separate();
  if (!std::isfinite(value)) {
    out_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", value);
    out_ += buf;
  }
  return *this;
}
JsonWriter& JsonWriter::Bool(bool value) {
  Separate();
  out_ += value ? "true" : "false";
  return *this;
}
JsonWriter& JsonWriter::Null() {
  Separate();
  out_ += "null";
  return *this;
}
JsonWriter& JsonWriter::Raw(std::string_view json) {
  Separate();
  out_ += json.empty() ? std::string_view("null") : json;
  return *this;
}

int PrintJsonError(const std::string& command, const std::string& path, const Error& e) {
  const int code = ExitCodeFor(e);
  std::fprintf(stderr, "zckpt %s: %s\n", command.c_str(), Printable(e.what(), /*message=*/true).c_str());
  JsonWriter jw;
  jw.BeginObject().Key("file").String(path).Key("status").String(code == kExitBad ? "corrupt" : "error");
  jw.Key("error").String(e.what()).EndObject();
  std::printf("%s\n", jw.str().c_str());
  return code;
}

}  // namespace zckpt::cli
