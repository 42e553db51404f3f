#include "safetensors/header_writer.h"

#include <cstdio>

namespace zckpt::safetensors {

namespace {

// serde_json's string escaping: ", \ and the C0 controls (\b \t \n \f \r by name, the rest as
// \u00xx in lowercase hex); everything else, non-ASCII and DEL included, verbatim.
void AppendString(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

}  // namespace

std::string FormatMetadataJson(const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string out = "{";
  for (size_t i = 0; i < metadata.size(); ++i) {
    if (i) out += ',';
    AppendString(out, metadata[i].first);
    out += ':';
    AppendString(out, metadata[i].second);
  }
  return out + "}";
}

bool WriterOrder(const TensorEntry& a, const TensorEntry& b) {
  if (a.dtype.rank != b.dtype.rank) return a.dtype.rank > b.dtype.rank;
  return a.name < b.name;  // std::string compares bytes as unsigned char, as Rust's str does
}

std::string FormatHeader(const std::vector<TensorEntry>& tensors, bool has_metadata,
                         const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string out = "{";
  bool first = true;
  if (has_metadata) {
    out += "\"__metadata__\":" + FormatMetadataJson(metadata);
    first = false;
  }
  for (const TensorEntry& t : tensors) {
    if (!first) out += ',';
    first = false;
    AppendString(out, t.name);
    out += ":{\"dtype\":";
    AppendString(out, std::string(t.dtype.name));
    out += ",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(t.shape[i]);
    }
    out += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  out += '}';
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

}  // namespace zckpt::safetensors
