// Reading a .zckpt container: the index copied into private memory and validated as a whole at
// open (spec §7), then infallible accessors that decode records from that copy, plus chunk
// decoding and verification.
//
// Another process may rewrite or truncate the file while it is read. Nothing here trusts the file
// twice: the superblock, footer and index are read once (pread) into memory of the Container's
// own, validated there, and every later bound (a chunk's offset and sizes, a tensor's shape and
// offset, a storage's extent) comes from that copy. Data bytes are read with pread into the
// caller's (or a private) buffer and checked there, so what is checked is what is delivered
// (Verify, which delivers nothing, reads the mapping under a SIGBUS guard), and a file that
// shrank gives Error(kIo) naming it, never a SIGBUS.
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
namespace format::internal {
struct ContainerFile;
}

// A tensor record with its strings and dims resolved (string views into the Container's private
// copy of the index: valid as long as the Container).
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

// One problem found by a verification: its kind, its place as fields, and a message that says
// them in words.
struct VerifyProblem {
  ErrorKind kind = ErrorKind::kCorrupt;  // IsFinding(kind) always
  std::string message;  // names the file, storage key, tensors viewing it, chunk and byte ranges
  ErrorPlace place;     // place.chunk: the chunk index, or -1 when not about a chunk
  static VerifyProblem Of(const Error& e) { return {e.kind(), e.what(), e.place()}; }
};

struct VerifyOptions {
  // Checking threads. Unset or 0: the hardware threads. Either way no more than one per 4 MiB of
  // data.
  std::optional<unsigned> threads;
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
  // `path` may be an object URL, s3://BUCKET/KEY (S3-compatible storage configured as the AWS
  // tools are: src/remote/README.md): its ETag is pinned at open, every byte is a ranged GET, a
  // chunk failing its checksum is fetched again before it is refused.
  static std::unique_ptr<Container> Open(const std::string& path);
  // Same over caller-owned memory that must outlive the Container (tests, fuzzers).
  static std::unique_ptr<Container> OpenMemory(const void* data, size_t size, std::string name);
  ~Container();

  const std::string& path() const;
  uint64_t file_bytes() const;
  const format::Superblock& superblock() const { return superblock_; }
  const format::Footer& footer() const { return footer_; }

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

  // A copy of the bytes of blob `b`, checked against its XXH3 (the copy is what was hashed):
  // Error(kCorrupt) naming the file and the blob when they differ, Error(kIo) when the file
  // shrank.
  std::vector<uint8_t> CheckedBlobBytes(const BlobInfo& b) const;

  // Reads chunk i into dst (exactly chunk(i).raw_bytes bytes, sizes from the private index). A raw
  // chunk is read straight into dst and, with `check`, hashed there; a zstd chunk's stored bytes
  // are read into a per-thread buffer, hashed there (with `check`) and decoded from it into dst,
  // the decoder bounded by raw_bytes. With `check` the stored checksum (and the raw one for zstd)
  // must match: Error(kCorrupt) with a message from DescribeChunk otherwise, or on a bad zstd frame
  // (always checked whole). Error(kIo) when the file shrank. From an object (Open of s3://), a
  // chunk that fails is fetched again (with backoff) a few times before the error.
  void ReadChunk(uint64_t i, void* dst, bool check = true) const;
  // Chunk i's place: the file, its storage's key, the tensors viewing it, its file and storage
  // byte ranges.
  ErrorPlace ChunkPlace(uint64_t i) const;
  // ChunkPlace(i) in words:
  // "FILE: storage 'KEY' (tensors a.weight, b.bias), chunk I, file bytes [X, Y), storage bytes [P, Q)"
  // I is the index in the chunk table; the list names at most 8 tensors ("..., and N more"),
  // "(no tensors)" when none views the storage.
  std::string DescribeChunk(uint64_t i) const;
  // Error(kind) about chunk i: "DescribeChunk(i): why", carrying ChunkPlace(i).
  Error ChunkError(ErrorKind kind, uint64_t i, const std::string& why) const;

  // Everything spec §7 "Verification" lists, in parallel; collects every problem (each bad chunk,
  // each bad blob, each gap holding a nonzero byte), sorted by file offset. Every byte is read
  // once, from the mapping under a SIGBUS guard (a zstd chunk from a private copy that its
  // checksum and its decoder both read). Throws Error(kCancelled), Error(kIo) naming the file when
  // it shrank meanwhile (or std::bad_alloc); a damaged data region is reported, not thrown.
  VerifyReport Verify(const VerifyOptions& options = {}) const;

 private:
  struct Table {
    uint64_t offset = 0;  // offset in index_ (relative to index_offset)
    uint64_t count = 0;
    uint32_t record_bytes = 0;
  };
  // zckpt's own readers reach the file and the index copy through format/container_file.h.
  friend struct format::internal::ContainerFile;
  explicit Container(std::unique_ptr<MappedFile> file);
  static std::unique_ptr<Container> OpenFile(const std::string& path);
  static std::unique_ptr<Container> OpenObject(const std::string& url);
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

  const uint8_t* Record(const Table& t, uint64_t i) const;  // into index_
  std::string_view String(format::StringRef ref) const;
  int64_t Dim(uint64_t i) const;

  std::unique_ptr<MappedFile> file_;
  // [index_offset, footer) read once at open: every record, string and dim comes from here.
  std::vector<uint8_t> index_;
  format::Superblock superblock_;
  format::Footer footer_;
  Table storages_, chunks_, tensors_, dims_, blobs_, metadata_, strings_;
  // Record indices sorted by name, built at open for O(log n) lookups (and the uniqueness rules).
  std::vector<uint32_t> tensor_order_, storage_order_, blob_order_, metadata_order_;
  // Tensor indices sorted by (storage, index), for TensorsOfStorage.
  std::vector<uint32_t> tensors_by_storage_;
};

}  // namespace zckpt
