// Writing a safetensors header the way safetensors' own writer (serde_json) does, so a file
// zckpt exports is byte-identical to the one `safetensors.torch.save_file` writes for the same
// tensors: compact JSON, "__metadata__" first, then the tensors in byte-buffer order, padded
// with spaces to a multiple of 8 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "safetensors/header.h"

namespace zckpt::safetensors {

// The N header bytes (JSON + padding) for `tensors`, which must already be in byte-buffer order
// with their data_offsets set. `metadata` is written when `has_metadata`, in the given order.
std::string FormatHeader(const std::vector<TensorEntry>& tensors, bool has_metadata,
                         const std::vector<std::pair<std::string, std::string>>& metadata);

// `metadata` as a compact JSON object (keys in the given order), escaped as FormatHeader does.
std::string FormatMetadataJson(const std::vector<std::pair<std::string, std::string>>& metadata);

// The order safetensors' writer lays tensors out in: dtype rank descending, then name (bytes).
bool WriterOrder(const TensorEntry& a, const TensorEntry& b);

}  // namespace zckpt::safetensors
