// The index file of a sharded Hugging Face checkpoint (`model.safetensors.index.json`,
// `pytorch_model.bin.index.json`): {"metadata": {...}, "weight_map": {tensor: shard file}}.
// Converting the folder renames the shards, so the index is rewritten to name the new files.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace zckpt::convert {

// True for `<checkpoint name>.index.json` (model.safetensors.index.json, pytorch_model.bin.index.json,
// diffusion_pytorch_model.safetensors.index.json, ...).
bool IsShardIndexName(const std::string& name);

// The index with every weight_map value that `rename` maps replaced by its new name (keys, their
// order and every other field kept), as JSON with a 2-space indent and a final newline, as
// transformers writes it. Throws Error(kCorrupt) naming `path` when the text is not a JSON
// object with a "weight_map" object of strings.
std::string RewriteShardIndex(std::string_view json, const std::function<std::optional<std::string>(const std::string&)>& rename,
                              const std::string& path);

}  // namespace zckpt::convert
