// The streaming writer of spec §2: superblock first, chunks and blobs as they come, the index
// and footer at Commit. Storages are re-chunked at chunk_bytes whatever the size of the pieces
// the caller appends; the chunk pipeline hashes/compresses them in parallel and returns them in
// order, and the writer lays each at its storage's alignment with zero padding.
#include "zckpt/container_writer.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <unordered_set>

#include "common/atomic_file.h"
#include "common/byte_store.h"
#include "format/bytes.h"
#include "format/record_codec.h"
#include "format/chunk_pipeline.h"
#include "format/index_builder.h"
#include "format/layout.h"
#include "zckpt/error.h"

namespace zckpt {

using namespace format;
using namespace format::internal;

namespace {

[[noreturn]] void Invalid(const std::string& what) { throw Error(ErrorKind::kInvalidArgument, what); }

// AddStorage reads storages at least this large in place instead of copying them into chunks.
constexpr uint64_t kBorrowMinBytes = 1ull << 20;

unsigned ResolveThreads(unsigned threads) {
  return threads ? threads : std::max(1u, std::thread::hardware_concurrency());
}

// The options as written: 0 for chunk_bytes (as for threads) is the default.
WriterOptions CheckOptions(WriterOptions o, const std::string& destination) {
  if (o.chunk_bytes == 0) o.chunk_bytes = format::kDefaultChunkBytes;
  if (const char* why = SuperblockParameterError(o.chunk_bytes, o.large_alignment, o.small_alignment))
    Invalid(destination + ": " + why);
  if (o.zstd_level < 0 || o.zstd_level > ZSTD_maxCLevel())
    Invalid(destination + ": zstd_level must be 0 (raw) or 1.." + std::to_string(ZSTD_maxCLevel()));
  return o;
}

// Where the bytes go: a local file written atomically (common/atomic_file.h), or the sink of
// the byte store that claims the destination (common/byte_store.h; s3://: a multipart upload
// that appears only at Commit).
class Output {
 public:
  explicit Output(const std::string& destination) : destination_(destination) {
    if (const ByteStore* store = ByteStoreFor(destination)) object_ = store->create(destination);
    else local_ = std::make_unique<AtomicFile>(destination);
  }
  void Write(const void* data, size_t n) { object_ ? object_->Write(data, n) : local_->Write(data, n); }
  void WriteZeros(uint64_t n) {
    if (local_) return local_->WriteZeros(n);
    static const uint8_t zeros[4096] = {};
    for (; n > 0; n -= std::min<uint64_t>(n, sizeof zeros)) object_->Write(zeros, std::min<uint64_t>(n, sizeof zeros));
  }
  void WriteAt(uint64_t offset, const void* data, size_t n) {
    object_ ? object_->WriteAt(offset, data, n) : local_->WriteAt(offset, data, n);
  }
  uint64_t position() const { return object_ ? object_->position() : local_->position(); }
  const std::string& destination() const { return destination_; }
  void Commit() { object_ ? object_->Commit() : (void)local_->Commit(); }
  void Abort() { object_ ? object_->Abort() : local_->Abort(); }

 private:
  std::string destination_;
  std::unique_ptr<AtomicFile> local_;
  std::unique_ptr<ByteSink> object_;
};

struct StorageEntry {
  StorageRecord record;
  std::string key, location;
};

struct BlobEntry {
  std::string name;
  uint64_t offset, bytes, checksum;
};

}  // namespace

struct ContainerWriter::Impl {
  Impl(const std::string& destination, const WriterOptions& o)
      : options(CheckOptions(o, destination)),
        file(destination),
        pipeline(ResolveThreads(o.threads), o.zstd_level, [this](const ChunkJob& job) { WriteChunk(job); }) {
    superblock.chunk_bytes = options.chunk_bytes;
    superblock.large_alignment = options.large_alignment;
    superblock.small_alignment = options.small_alignment;
    superblock.large_threshold = options.large_threshold;
    superblock.minor = 0;  // raised by the dtypes written (spec §9: the lowest version that holds them)
    uint8_t bytes[kSuperblockBytes];
    EncodeSuperblock(superblock, bytes);
    file.Write(bytes, sizeof bytes);
  }

  void Pad(uint64_t alignment) { file.WriteZeros(AlignUp(file.position(), alignment) - file.position()); }

  // The pipeline's sink: the next chunk in file order.
  void WriteChunk(const ChunkJob& job) {
    Pad(job.alignment);
    std::span<const uint8_t> stored = job.stored();
    chunks.push_back({file.position(), stored.size(), job.input().size(), job.stored_checksum, job.raw_checksum,
                      job.storage, static_cast<uint8_t>(job.compressed ? Codec::kZstd : Codec::kNone)});
    file.Write(stored.data(), stored.size());
    stats.chunks++;
    stats.compressed_chunks += job.compressed;
    stats.stored_bytes += stored.size();
  }

  void CheckNoOpenStorage(const char* what) const {
    if (open) Invalid(file.destination() + ": " + what + " while storage '" + storages.back().key + "' is open");
  }

  uint32_t Begin(const NewStorage& s, uint64_t total) {
    CheckNoOpenStorage("BeginStorage");
    auto code = static_cast<uint16_t>(s.dtype);
    if (!IsValidDType(code)) Invalid(file.destination() + ": storage '" + s.key + "' has an invalid dtype");
    if (s.untyped && s.dtype != DType::kUInt8) Invalid(file.destination() + ": untyped storage '" + s.key + "' must be uint8");
    if (total % DTypeSize(s.dtype) != 0)
      Invalid(file.destination() + ": storage '" + s.key + "' has " + std::to_string(total) +
              " bytes, not a multiple of its dtype's size");
    if (storages.size() >= UINT32_MAX) Invalid(file.destination() + ": too many storages");
    if (!storage_keys.insert(s.key).second) Invalid(file.destination() + ": duplicate storage key '" + s.key + "'");
    StorageRecord r;
    r.raw_bytes = total;
    r.first_chunk = submitted;
    r.chunk_count = ChunkCount(total, options.chunk_bytes);
    r.dtype = code;
    superblock.minor = std::max(superblock.minor, MinorVersionOfDType(s.dtype));
    r.flags = s.untyped ? kStorageUntyped : 0;
    storages.push_back({r, s.key, s.location});
    open = true;
    appended = 0;
    alignment = StorageAlignment(superblock, total);
    stats.storages++;
    stats.raw_bytes += total;
    return static_cast<uint32_t>(storages.size() - 1);
  }

  void Append(std::span<const uint8_t> bytes) {
    if (!open) Invalid(file.destination() + ": AppendStorage without BeginStorage");
    const StorageRecord& r = storages.back().record;
    if (bytes.size() > r.raw_bytes - appended)
      Invalid(file.destination() + ": storage '" + storages.back().key + "' given more than its " +
              std::to_string(r.raw_bytes) + " bytes");
    while (!bytes.empty()) {
      if (!filling) {
        filling = pipeline.NewJob();
        filling->storage = static_cast<uint32_t>(storages.size() - 1);
        filling->alignment = alignment;
      }
      uint64_t want = ChunkRawBytes(r.raw_bytes, options.chunk_bytes, appended / options.chunk_bytes);
      filling->raw.reserve(want);  // recycled buffers already have it: no regrowth per chunk
      size_t take = static_cast<size_t>(std::min<uint64_t>(want - filling->raw.size(), bytes.size()));
      filling->raw.insert(filling->raw.end(), bytes.begin(), bytes.begin() + take);
      bytes = bytes.subspan(take);
      appended += take;
      if (filling->raw.size() == want) {
        submitted++;
        pipeline.Submit(std::move(filling));
      }
    }
  }

  // A whole storage from caller memory. Large ones are not copied: each chunk's job reads
  // `bytes` in place (hashing, compressing, writing), and every job has reached the file before
  // this returns, so `bytes` is free again. Small ones go through Append, as a pipeline drain per
  // storage would cost more than copying them (state dicts of thousands of norms and biases).
  uint32_t AddWhole(const NewStorage& s, std::span<const uint8_t> bytes) {
    uint32_t index = Begin(s, bytes.size());
    if (bytes.size() < kBorrowMinBytes) {
      Append(bytes);
      End();
      return index;
    }
    try {
      for (uint64_t off = 0; off < bytes.size(); off += options.chunk_bytes) {
        std::unique_ptr<ChunkJob> job = pipeline.NewJob();
        job->storage = index;
        job->alignment = alignment;
        job->borrows = true;
        job->borrowed = bytes.subspan(off, std::min<uint64_t>(options.chunk_bytes, bytes.size() - off));
        appended += job->borrowed.size();
        submitted++;
        pipeline.Submit(std::move(job));
      }
      End();
      pipeline.Drain();
    } catch (...) {
      pipeline.Abandon();  // no worker may read `bytes` once the caller has it back
      throw;
    }
    return index;
  }

  void End() {
    if (!open) Invalid(file.destination() + ": EndStorage without BeginStorage");
    if (appended != storages.back().record.raw_bytes)
      Invalid(file.destination() + ": storage '" + storages.back().key + "' ended after " + std::to_string(appended) +
              " of its " + std::to_string(storages.back().record.raw_bytes) + " bytes");
    open = false;
  }

  void AddBlob(const std::string& name, std::span<const uint8_t> bytes) {
    CheckNoOpenStorage("AddBlob");
    if (!blob_names.insert(name).second) Invalid(file.destination() + ": duplicate blob name '" + name + "'");
    uint64_t offset = 0;
    if (!bytes.empty()) {
      pipeline.Drain();  // the chunks submitted so far come first in the file
      Pad(options.small_alignment);
      offset = file.position();
      file.Write(bytes.data(), bytes.size());
    }
    blobs.push_back({name, offset, bytes.size(), Checksum(bytes.data(), bytes.size())});
  }

  // Commit's checks of the tensors (spec §5.3), then their records; raises the minor version to
  // what their dtypes need.
  void AddTensorRecords(IndexBuilder& index) {
    for (const NewTensor& t : tensors) {
      auto fail = [&](const std::string& why) { Invalid(file.destination() + ": tensor '" + t.name + "': " + why); };
      if (t.storage >= storages.size()) fail("storage " + std::to_string(t.storage) + " does not exist");
      if (!IsValidDType(static_cast<uint16_t>(t.dtype))) fail("invalid dtype");
      if (t.shape.size() != t.stride.size()) fail("shape and stride differ in length");
      if (t.shape.size() > kMaxTensorDims) fail("more than 64 dimensions");
      if (t.flags & ~kKnownTensorFlags) fail("unknown flags");
      TensorExtent e = ComputeTensorExtent(t.storage_offset, t.shape.data(), t.stride.data(),
                                           static_cast<uint32_t>(t.shape.size()), DTypeSize(t.dtype));
      if (e.error) fail(e.error);
      uint64_t raw = storages[t.storage].record.raw_bytes;
      if (e.end > raw)
        fail("extent [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") is past the end of storage '" +
             storages[t.storage].key + "' (" + std::to_string(raw) + " bytes)");
      TensorRecord r;
      r.name = index.Intern(t.name);
      r.storage = t.storage;
      r.dtype = static_cast<uint16_t>(t.dtype);
      superblock.minor = std::max(superblock.minor, MinorVersionOfDType(t.dtype));
      r.ndim = static_cast<uint16_t>(t.shape.size());
      r.storage_offset = t.storage_offset;
      r.flags = t.flags;
      r.extra = index.Intern(t.extra);
      index.AddTensor(r, t.shape, t.stride);
    }
  }

  WriterStats Commit() {
    CheckNoOpenStorage("Commit");
    pipeline.Drain();
    IndexBuilder index;
    AddTensorRecords(index);
    for (StorageEntry& s : storages) {
      s.record.key = index.Intern(s.key);
      s.record.location = index.Intern(s.location);
      index.AddStorage(s.record);
    }
    for (const ChunkRecord& c : chunks) index.AddChunk(c);
    for (const BlobEntry& b : blobs) index.AddBlob({index.Intern(b.name), b.offset, b.bytes, b.checksum});
    for (const auto& [key, value] : metadata) index.AddMetadata({index.Intern(key), index.Intern(value)});
    std::vector<uint8_t> bytes = index.Finish();

    Pad(options.small_alignment);
    Footer footer;
    footer.index_offset = file.position();
    footer.index_bytes = bytes.size();
    footer.index_checksum = Checksum(bytes.data(), bytes.size());
    file.Write(bytes.data(), bytes.size());
    Pad(64);
    footer.file_bytes = file.position() + kFooterBytes;
    footer.minor = superblock.minor;
    if (superblock.minor != 0) {  // a dtype of a later minor: the superblock written first says 1.0
      uint8_t sb[kSuperblockBytes];
      EncodeSuperblock(superblock, sb);
      file.WriteAt(0, sb, sizeof sb);
    }
    uint8_t encoded[kFooterBytes];
    EncodeFooter(footer, encoded);
    file.Write(encoded, sizeof encoded);
    file.Commit();
    stats.file_bytes = footer.file_bytes;
    return stats;
  }

  // Every public call runs through Run: an exception leaves the writer failed, with its
  // temporary file removed, and later calls refuse to run on a half-written file.
  template <typename Fn>
  auto Run(Fn&& fn) -> decltype(fn()) {
    if (committed) Invalid(file.destination() + ": writer already committed");
    if (failed) Invalid(file.destination() + ": writer failed earlier; nothing more can be written");
    try {
      return fn();
    } catch (...) {
      failed = true;
      file.Abort();
      throw;
    }
  }

  WriterOptions options;
  Superblock superblock;
  Output file;
  std::vector<StorageEntry> storages;
  std::vector<ChunkRecord> chunks;  // written so far, in file order
  std::vector<NewTensor> tensors;
  std::vector<BlobEntry> blobs;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::unordered_set<std::string> storage_keys, tensor_names, blob_names, metadata_keys;
  // The storage being appended to.
  bool open = false;
  uint64_t appended = 0;
  uint32_t alignment = 0;
  std::unique_ptr<ChunkJob> filling;
  uint64_t submitted = 0;  // chunks handed to the pipeline (written or in flight)
  bool failed = false, committed = false;
  WriterStats stats;
  ChunkPipeline pipeline;  // last: its workers stop before the members the sink uses go away
};

ContainerWriter::ContainerWriter(const std::string& destination, const WriterOptions& options)
    : impl_(std::make_unique<Impl>(destination, options)) {}

ContainerWriter::~ContainerWriter() = default;

uint32_t ContainerWriter::AddStorage(const NewStorage& storage, std::span<const uint8_t> bytes) {
  return impl_->Run([&] { return impl_->AddWhole(storage, bytes); });
}

uint32_t ContainerWriter::BeginStorage(const NewStorage& storage, uint64_t total_bytes) {
  return impl_->Run([&] { return impl_->Begin(storage, total_bytes); });
}

void ContainerWriter::AppendStorage(std::span<const uint8_t> bytes) {
  impl_->Run([&] { impl_->Append(bytes); });
}

void ContainerWriter::EndStorage() {
  impl_->Run([&] { impl_->End(); });
}

void ContainerWriter::AddTensor(const NewTensor& tensor) {
  impl_->Run([&] {
    if (!impl_->tensor_names.insert(tensor.name).second)
      Invalid(impl_->file.destination() + ": duplicate tensor name '" + tensor.name + "'");
    impl_->tensors.push_back(tensor);
  });
}

void ContainerWriter::AddBlob(const std::string& name, std::span<const uint8_t> bytes) {
  impl_->Run([&] { impl_->AddBlob(name, bytes); });
}

void ContainerWriter::SetMetadata(const std::string& key, const std::string& value) {
  impl_->Run([&] {
    if (!impl_->metadata_keys.insert(key).second)
      Invalid(impl_->file.destination() + ": duplicate metadata key '" + key + "'");
    impl_->metadata.emplace_back(key, value);
  });
}

WriterStats ContainerWriter::Commit() {
  return impl_->Run([&] {
    WriterStats stats = impl_->Commit();
    impl_->committed = true;
    return stats;
  });
}

const std::string& ContainerWriter::destination() const { return impl_->file.destination(); }

}  // namespace zckpt
