// Minimal streaming JSON writer for `--json` outputs (no dependency for a few dozen lines).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zckpt/error.h"

namespace zckpt::cli {

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view key);
  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& UInt(uint64_t value);
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // Inserts already-serialised JSON (e.g. a tensor's `extra`) as a value.
  JsonWriter& Raw(std::string_view json);
  const std::string& str() const { return out_; }

 private:
  void Separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

std::string JsonEscape(std::string_view s);

// True when `s` is exactly one JSON value (RFC 8259; objects and arrays nested at most 64 deep,
// strings valid UTF-8 without raw control characters), surrounding whitespace allowed: what may
// go into a document through JsonWriter::Raw.
bool IsJson(std::string_view s);

// The one JSON shape of a command that could not do its work on `path` with --json (ls, load;
// verify's per-file objects carry the same fields): {"file", "status": "corrupt" | "error",
// "error": message} on stdout, and the message on stderr as without --json ("zckpt CMD: ...").
// Returns the exit code (ExitCodeFor).
int PrintJsonError(const std::string& command, const std::string& path, const Error& e);

}  // namespace zckpt::cli
