// Stores of bytes that are not local files (S3-compatible object storage, and whatever comes
// next: GCS's JSON API, Azure Blob, WebHDFS): a store claims the URLs of its scheme and opens
// them for reading (a ByteSource) or writing (a ByteSink). The format asks this table for the
// path it is given and knows no store; a store registers itself when its library is loaded
// (src/remote/s3_object.cc), so a new one is added without touching the format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/byte_source.h"

namespace zckpt {

// Where a writer's bytes go when they do not go to a local file: appended in order, the
// object appearing whole at Commit or not at all (Abort, or destruction before Commit).
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void Write(const void* data, size_t n) = 0;
  // Overwrites [offset, offset + n) of what was written; a sink may hold only its start for
  // that (an object: its first part), which is where a container's superblock is rewritten.
  virtual void WriteAt(uint64_t offset, const void* data, size_t n) = 0;
  virtual uint64_t position() const = 0;
  virtual void Commit() = 0;
  virtual void Abort() = 0;
};

struct ByteStore {
  std::string_view scheme;  // "s3://": the paths that start with it are the store's
  std::unique_ptr<ByteSource> (*open)(const std::string& url);
  std::unique_ptr<ByteSink> (*create)(const std::string& url);
};

// Adds `store` (one per scheme: the same scheme again replaces it). Returns true, for a
// registration at load: `const bool registered = RegisterByteStore({...});`.
bool RegisterByteStore(const ByteStore& store);
// The store whose scheme starts `path`, or nullptr (a local path).
const ByteStore* ByteStoreFor(std::string_view path);

}  // namespace zckpt
