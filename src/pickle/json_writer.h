// A compact JSON object builder for the `extra` strings of torch_model.h (no spaces, keys in
// insertion order). Only what those strings need: ints, floats, bools, strings, nested raw JSON.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zckpt/text.h"

namespace zckpt::pickle {

using zckpt::JsonString;
std::string JsonIntList(const std::vector<int64_t>& v);
std::string JsonStringList(const std::vector<std::string>& v);
// Shortest round-trip text; JSON has no nan/inf, so those become null.
std::string JsonNumber(double x);

class JsonObject {
 public:
  JsonObject& Int(std::string_view key, int64_t v) { return Raw(key, std::to_string(v)); }
  JsonObject& Number(std::string_view key, double v) { return Raw(key, JsonNumber(v)); }
  JsonObject& Bool(std::string_view key, bool v) { return Raw(key, v ? "true" : "false"); }
  JsonObject& String(std::string_view key, std::string_view v) { return Raw(key, JsonString(v)); }
  JsonObject& IntList(std::string_view key, const std::vector<int64_t>& v) { return Raw(key, JsonIntList(v)); }
  // `json` is inserted as is (an already built array or object).
  JsonObject& Raw(std::string_view key, std::string_view json) {
    body_ += body_.empty() ? "" : ",";
    body_ += JsonString(key);
    body_ += ':';
    body_ += json;
    return *this;
  }
  bool empty() const { return body_.empty(); }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace zckpt::pickle
