// Writing a .zckpt container in one streaming pass (spec §2): superblock, then storages chunk by
// chunk and blobs as they are added, then index and footer at Commit(). The file appears at its
// destination only when Commit() has fsynced and renamed it (AtomicFile); a writer destroyed
// before Commit() leaves nothing behind.
//
// Any exception from a method (Error kInvalidArgument for a bad argument, kIo for a failed
// write) leaves the writer failed: its temporary file is removed at once and every later call
// throws kInvalidArgument. Memory stays bounded by about 2 x threads chunks however large the
// storages are.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zckpt/dtype.h"
#include "zckpt/format.h"

namespace zckpt {

struct WriterOptions {
  uint64_t chunk_bytes = format::kDefaultChunkBytes;  // 0: the default too
  uint32_t large_alignment = format::kDefaultLargeAlignment;
  uint32_t small_alignment = format::kDefaultSmallAlignment;
  uint64_t large_threshold = format::kDefaultLargeThreshold;
  // 0: store raw. 1..22: zstd level per chunk; a chunk is kept raw when compression does not
  // make it smaller.
  int zstd_level = 0;
  // Threads hashing/compressing chunks (0: hardware concurrency).
  unsigned threads = 0;
};

struct NewStorage {
  std::string key;
  std::string location = "cpu";
  DType dtype = DType::kUInt8;
  bool untyped = false;
};

struct NewTensor {
  std::string name;
  uint32_t storage = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  uint64_t storage_offset = 0;
  uint32_t flags = 0;  // format::kTensor*
  std::string extra;   // JSON or empty
};

struct WriterStats {
  uint64_t storages = 0, chunks = 0, compressed_chunks = 0;
  uint64_t raw_bytes = 0, stored_bytes = 0, file_bytes = 0;
};

class ContainerWriter {
 public:
  // Validates the options (spec §3 ranges; Error kInvalidArgument) and starts the temporary file.
  ContainerWriter(const std::string& destination, const WriterOptions& options = {});
  ~ContainerWriter();  // removes the temporary file unless committed
  ContainerWriter(const ContainerWriter&) = delete;
  ContainerWriter& operator=(const ContainerWriter&) = delete;

  // A whole storage from memory. Returns its index. Keys are unique; untyped storages are uint8;
  // the size is a multiple of the dtype's. Storages of 1 MiB or more are hashed and written from
  // `bytes` itself (no copy), chunk by chunk; all of it is on its way to the file when this
  // returns, and `bytes` is not read again.
  uint32_t AddStorage(const NewStorage& storage, std::span<const uint8_t> bytes);
  // A storage in pieces of any size; exactly `total_bytes` must be appended before EndStorage.
  // Only one storage is open at a time, and no blob may be added while one is open.
  uint32_t BeginStorage(const NewStorage& storage, uint64_t total_bytes);
  void AppendStorage(std::span<const uint8_t> bytes);
  void EndStorage();

  // Tensors may be added at any time before Commit; their storage must exist by Commit, and
  // their dtype, dims and extent are checked then (Error kInvalidArgument naming the tensor).
  // A duplicate name is refused at once.
  void AddTensor(const NewTensor& tensor);
  // Blobs are written at once (after the chunks submitted so far). Names are unique.
  void AddBlob(const std::string& name, std::span<const uint8_t> bytes);
  // Keys are unique: setting a key twice is an error.
  void SetMetadata(const std::string& key, const std::string& value);

  // Writes index and footer, fsyncs, renames into place. Returns what was written.
  WriterStats Commit();

  const std::string& destination() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zckpt
