// Reading a container's storages back out for the exporters: chunk by chunk, every checksum
// checked (a corrupt container must not turn into a plausible-looking .pt or .safetensors),
// source pages dropped behind the stream so a multi-GiB storage keeps RSS bounded.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "zckpt/container.h"

namespace zckpt::convert {

using ByteSink = std::function<void(std::span<const uint8_t>)>;

// Bytes [begin, end) of storage `s` (end <= its raw_bytes), in order, in pieces of at most a chunk.
void StreamStorageRange(const Container& c, uint32_t s, uint64_t begin, uint64_t end, const ByteSink& sink);
// The whole storage.
void StreamStorage(const Container& c, uint32_t s, const ByteSink& sink);

// A blob the container's own metadata says it holds (`named_by`), checksum checked: one that is
// missing makes the container damaged or forged (kCorrupt, exit 1), not the caller's mistake.
std::span<const uint8_t> CheckedBlob(const Container& c, std::string_view name, std::string_view named_by);

}  // namespace zckpt::convert
