// Reading a container's storages back out (exporters, DCP export, merge): chunk by chunk, every
// checksum checked before its bytes are handed on (a corrupt container must not turn into a
// plausible-looking .pt, .safetensors, .distcp or merged model), only the chunks a range touches
// read, with pread into one chunk-sized buffer (checked where it lands, never re-read from the
// mapping) so a multi-GiB storage keeps RSS bounded. Memory: one chunk.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "zckpt/container.h"

namespace zckpt::checkpoint {

using ByteSink = std::function<void(std::span<const uint8_t>)>;

// Bytes [begin, end) of storage `s` (end <= its raw_bytes, else kCorrupt), in order, in pieces of
// at most a chunk (consecutive: a sink that needs the offset counts from `begin`). A bad chunk is
// Error(kCorrupt) naming the file, storage, tensors and byte range (Container::DescribeChunk).
void StreamStorageRange(const Container& c, uint32_t s, uint64_t begin, uint64_t end, const ByteSink& sink);
// The whole storage.
void StreamStorage(const Container& c, uint32_t s, const ByteSink& sink);

// A blob the container's own metadata says it holds (`named_by`), checksum checked (the copy
// returned is what was hashed): one that is missing makes the container damaged or forged
// (kCorrupt, exit 1), not the caller's mistake.
std::vector<uint8_t> CheckedBlob(const Container& c, std::string_view name, std::string_view named_by);

}  // namespace zckpt::checkpoint
