// Reading a safetensors file's header, every rule of its specification checked before any
// tensor byte is trusted (https://huggingface.co/docs/safetensors, "Format"):
//
//   u64 N (little-endian) | N bytes of UTF-8 JSON, starting with '{', maybe padded with spaces |
//   the byte buffer, which the tensors' data_offsets (relative to its start) cover exactly.
//
// The JSON is one object: an optional "__metadata__" (string -> string) and, per tensor,
// {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}. Refused (kCorrupt, naming
// the file, the tensor and the byte range): N above 100,000,000 (safetensors' own limit) or past
// the end of the file; a header that is not UTF-8, not JSON, not an object, or holds a key twice;
// a tensor entry without one of its three fields, with a field it does not define, or with
// offsets that are not non-negative integers; sizes that are not dtype x shape (computed
// without overflow); offsets that leave a gap, overlap, or do not end where the file ends.
// A dtype safetensors does not define, or one torch has no type for (F6_*), is kUnsupported.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/mapped_file.h"
#include "safetensors/dtypes.h"

namespace zckpt::safetensors {

// "[2, 3]", for messages.
template <typename T>
std::string FormatShape(const std::vector<T>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// safetensors' MAX_HEADER_SIZE.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorEntry {
  std::string name;
  DTypeInfo dtype;
  std::vector<uint64_t> shape;  // as the header has it (F4: the last dimension in 4-bit elements)
  uint64_t begin = 0;           // data_offsets, relative to the byte buffer
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
  // The shape torch gives the tensor (F4 -> float4_e2m1fn_x2: the last dimension halved).
  std::vector<int64_t> TorchShape() const;
};

struct Header {
  uint64_t header_bytes = 0;  // N: the JSON and its padding
  uint64_t data_offset = 0;   // 8 + N: where the byte buffer starts in the file
  uint64_t data_bytes = 0;    // the byte buffer's size, = the last tensor's END
  // In byte-buffer order (by BEGIN, then END; empty tensors at one offset in header order).
  std::vector<TensorEntry> tensors;
  bool has_metadata = false;  // "__metadata__" present and not null
  std::vector<std::pair<std::string, std::string>> metadata;  // in header order
};

// Parses and checks the header of a whole safetensors file held in `file`. `path` names the
// file in messages.
Header ParseFile(std::span<const uint8_t> file, const std::string& path);

// ParseFile of the safetensors file `file`, whose length field and JSON header are first copied
// into private memory (MappedFile::ReadAt; the JSON kept in *json for the caller's use): a file
// truncated while it is parsed is Error(kIo) naming it, never a SIGBUS from the mapping, and the
// header checked is the header used.
Header ReadFileHeader(const MappedFile& file, std::vector<uint8_t>* json);

// Parses and checks the JSON header alone (the N bytes after the length), for a byte buffer of
// `data_bytes` bytes (nullopt: whatever size the tensors cover from 0 without gap or overlap).
Header ParseHeaderJson(std::span<const uint8_t> json, std::optional<uint64_t> data_bytes, const std::string& path);

// True when `head` (the file's first bytes, at least 9 when the file has them) starts the way a
// safetensors file does: a header length that fits in the file and safetensors' limit, then '{'.
// Never throws; says nothing about the rest.
bool LooksLikeSafetensors(std::span<const uint8_t> head, uint64_t file_bytes);

}  // namespace zckpt::safetensors
