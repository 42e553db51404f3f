#include "checkpoint/storage_stream.h"

#include <algorithm>
#include <string>
#include <vector>


namespace zckpt::checkpoint {

void StreamStorageRange(const Container& c, uint32_t s, uint64_t begin, uint64_t end, const ByteSink& sink) {
  StorageInfo info = c.storage(s);
  const uint64_t chunk_bytes = c.superblock().chunk_bytes;
  if (end > info.raw_bytes || begin > end)
    throw Error(ErrorKind::kCorrupt, c.path() + ": bytes [" + std::to_string(begin) + ", " + std::to_string(end) +
                                         ") asked of storage '" + std::string(info.key) + "', which holds " +
                                         std::to_string(info.raw_bytes));
  if (begin == end) return;
  std::vector<uint8_t> buffer;
  for (uint64_t k = begin / chunk_bytes; k < info.chunk_count && k * chunk_bytes < end; ++k) {
    uint64_t i = info.first_chunk + k;
    format::ChunkRecord ch = c.chunk(i);
    buffer.resize(ch.raw_bytes);
    c.ReadChunk(i, buffer.data(), /*check=*/true);  // pread, checked in the buffer it lands in
    uint64_t chunk_begin = k * chunk_bytes;
    uint64_t from = std::max(begin, chunk_begin) - chunk_begin;
    uint64_t to = std::min(end, chunk_begin + ch.raw_bytes) - chunk_begin;
    sink(std::span<const uint8_t>(buffer.data() + from, to - from));
  }
}

void StreamStorage(const Container& c, uint32_t s, const ByteSink& sink) {
  StreamStorageRange(c, s, 0, c.storage(s).raw_bytes, sink);
}

std::vector<uint8_t> CheckedBlob(const Container& c, std::string_view name, std::string_view named_by) {
  auto blob = c.FindBlob(name);
  if (!blob)
    throw Error(ErrorKind::kCorrupt, c.path() + ": corrupt: " + std::string(named_by) + " names '" + std::string(name) +
                                         "', but the container holds no blob (or storage) of that name");
  return c.CheckedBlobBytes(*blob);
}

}  // namespace zckpt::checkpoint
