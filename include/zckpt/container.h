// Reading a .zckpt container: a memory mapping validated as a whole at open (spec §7), then
// infallible accessors that decode records in place, plus chunk decoding and verification.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zckpt/dtype.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt {

class MappedFile;

// A tensor record with its strings and dims resolved (views into the mapping).
struct TensorInfo {
  uint32_t index = 0;
  std::string_view name;
  uint32_t storage = 0;
  DType dtype = DType::kInvalid;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  uint64_t storage_offset = 0;  // elements
  uint32_t flags = 0;
  std::string_view extra;  // JSON or empty
  // Byte range of the storage the tensor touches: [begin, end); empty when numel is 0.
  uint64_t byte_begin = 0;
  uint64_t byte_end = 0;
};

struct StorageInfo {
  uint32_t index = 0;
  std::string_view key;
  std::string_view location;
  DType dtype = DType::kInvalid;
  uint16_t flags = 0;
  uint64_t raw_bytes = 0;
  uint64_t first_chunk = 0;
  uint64_t chunk_count = 0;
  uint32_t alignment = 0;
  // True when every chunk is stored raw, so the bytes are contiguous at `data_offset`.
  bool contiguous = false;
  uint64_t data_offset = 0;  // offset of the first chunk (0 when empty)
};

struct BlobInfo {
  std::string_view name;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

// One problem found by Verify().
struct VerifyProblem {
  std::string message;  // names the file, storage key, tensors viewing it, chunk and byte range
  int64_t chunk = -1;   // chunk index, or -1 when not about a chunk
};

struct VerifyOptions {
  unsigned threads = 0;  // 0: hardware concurrency
  // Called as bytes are checked (done, total), total = file_bytes(); may be empty. Calls come
  // from worker threads but never two at once; the last one has done == total.
  std::function<void(uint64_t, uint64_t)> progress;
  // When it becomes true, Verify stops within a few MiB per thread and throws Error(kCancelled).
  const std::atomic<bool>* cancel = nullptr;
};

struct VerifyReport {
  bool ok() const { return problems.empty(); }
  std::vector<VerifyProblem> problems;
  uint64_t bytes_checked = 0;
  uint64_t chunks_checked = 0;
};

class Container {
 public:
  // Maps and validates `path` (spec §7 steps 1-4). Throws Error: kIo (cannot open),
  // kNotContainer (no superblock magic / too short), kCorrupt, kUnsupported.
  static std::unique_ptr<Container> Open(const std::string& path);
  // Same over caller-owned memory that must outlive the Container (tests, fuzzers).
  static std::unique_ptr<Container> OpenMemory(const void* data, size_t size, std::string name);
  ~Container();

  const std::string& path() const;
  uint64_t file_bytes() const;
  const format::Superblock& superblock() const { return superblock_; }
  const format::Footer& footer() const { return footer_; }
  const MappedFile& file() const { return *file_; }
  const uint8_t* data() const;

  uint32_t storage_count() const { return static_cast<uint32_t>(storages_.count); }
  uint64_t chunk_count() const { return chunks_.count; }
  uint32_t tensor_count() const { return static_cast<uint32_t>(tensors_.count); }
  uint32_t blob_count() const { return static_cast<uint32_t>(blobs_.count); }
  uint32_t metadata_count() const { return static_cast<uint32_t>(metadata_.count); }

  StorageInfo storage(uint32_t i) const;
  format::ChunkRecord chunk(uint64_t i) const;
  TensorInfo tensor(uint32_t i) const;
  BlobInfo blob(uint32_t i) const;
  std::pair<std::string_view, std::string_view> metadata(uint32_t i) const;

  std::optional<uint32_t> FindTensor(std::string_view name) const;
  std::optional<uint32_t> FindStorage(std::string_view key) const;
  std::optional<BlobInfo> FindBlob(std::string_view name) const;
  std::optional<std::string_view> FindMetadata(std::string_view key) const;
  // Tensors viewing storage `s`, in table order (for error messages and loaders).
  std::vector<uint32_t> TensorsOfStorage(uint32_t s) const;

  // Stored bytes of a chunk / bytes of a blob, as views into the mapping (not checked).
  std::span<const uint8_t> ChunkStored(uint64_t i) const;
  std::span<const uint8_t> BlobBytes(const BlobInfo& b) const;
  // The bytes of blob `b` after checking them against its XXH3: Error(kCorrupt) naming the file
  // and the blob when they differ.
  std::span<const uint8_t> CheckedBlobBytes(const BlobInfo& b) const;
  // Raw bytes of a contiguous storage (all chunks codec 0); empty span otherwise.
  std::span<const uint8_t> StorageBytes(uint32_t s) const;

  // Decodes chunk i into dst (exactly chunk(i).raw_bytes bytes). With `check`, verifies the
  // stored checksum (and the raw one for zstd) and throws Error(kCorrupt) with a message from
  // DescribeChunk on mismatch or a bad zstd frame.
  void ReadChunk(uint64_t i, void* dst, bool check = true) const;
  // "FILE: storage 'KEY' (tensors a.weight, b.bias), chunk I, file bytes [X, Y), storage bytes [P, Q)"
  // I is the index in the chunk table; the list names at most 8 tensors ("..., and N more"),
  // "(no tensors)" when none views the storage.
  std::string DescribeChunk(uint64_t i) const;

  // Everything spec §7 "Verification" lists, in parallel; collects every problem (each bad chunk,
  // each bad blob, each gap holding a nonzero byte), sorted by file offset. Throws only
  // Error(kCancelled) (or std::bad_alloc); a damaged data region is reported, not thrown.
  VerifyReport Verify(const VerifyOptions& options = {}) const;

 private:
  struct Table {
    uint64_t offset = 0;  // absolute file offset
    uint64_t count = 0;
    uint32_t record_bytes = 0;
  };
  explicit Container(std::unique_ptr<MappedFile> file);
  // Spec §7, one step each (container_validate.cc, container_records.cc).
  void Validate();
  void ValidateSuperblock();
  void ValidateFooter();
  void ValidateIndex();
  void ValidateStoragesAndChunks();
  void ValidateTensors();
  void ValidateBlobsAndMetadata();
  void ValidateStringRef(format::StringRef ref, const char* table, uint64_t record, const char* field) const;
  void BuildLookups();
  [[noreturn]] void Fail(ErrorKind kind, const std::string& what) const;

  const uint8_t* Record(const Table& t, uint64_t i) const;
  std::string_view String(format::StringRef ref) const;
  int64_t Dim(uint64_t i) const;

  std::unique_ptr<MappedFile> file_;
  format::Superblock superblock_;
  format::Footer footer_;
  Table storages_, chunks_, tensors_, dims_, blobs_, metadata_, strings_;
  // Record indices sorted by name, built at open for O(log n) lookups (and the uniqueness rules).
  std::vector<uint32_t> tensor_order_, storage_order_, blob_order_, metadata_order_;
  // Tensor indices sorted by (storage, index), for TensorsOfStorage.
  std::vector<uint32_t> tensors_by_storage_;
};

}  // namespace zckpt
