// The reader's entry points and its accessors. Everything here runs after Validate() has
// checked the whole index (spec §7 steps 1-4) in the Container's private copy, so accessors
// decode records from that copy without checks of their own.
#include "zckpt/container.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>

#include "common/byte_store.h"
#include "common/mapped_file.h"
#include "format/bytes.h"
#include "format/chunk_check.h"
#include "format/layout.h"
#include "format/record_codec.h"
#include "format/refetch.h"

namespace zckpt {

using format::internal::Load64;

std::unique_ptr<Container> Container::Open(const std::string& path) {
  // A URL a byte store claims (common/byte_store.h: s3://, registered by src/remote) is read
  // through the source the store opens; anything else is a local file.
  return ByteStoreFor(path) ? OpenObject(path) : OpenFile(path);
}

std::unique_ptr<Container> Container::OpenFile(const std::string& path) {
  std::unique_ptr<Container> c(new Container(std::make_unique<MappedFile>(path)));
  c->Validate();
  return c;
}

std::unique_ptr<Container> Container::OpenObject(const std::string& url) {
  // The object is pinned at open (its ETag) and read with ranged GETs. A superblock, footer or
  // index failing its checks may have been damaged on the way: the object is opened again (a
  // fresh HEAD, fresh reads) while the refetch rule allows.
  for (unsigned attempt = 1;; ++attempt) {
    std::unique_ptr<Container> c(new Container(std::make_unique<MappedFile>(ByteStoreFor(url)->open(url))));
    try {
      c->Validate();
      return c;
    } catch (const Error& e) {
      const bool damaged = e.kind() == ErrorKind::kCorrupt || e.kind() == ErrorKind::kNotContainer;
      if (!damaged || !format::internal::Refetch(c->file_->remote()).Again(attempt)) throw;
    }
  }
}

std::unique_ptr<Container> Container::OpenMemory(const void* data, size_t size, std::string name) {
  std::unique_ptr<Container> c(new Container(std::make_unique<MappedFile>(data, size, std::move(name))));
  c->Validate();
  return c;
}

Container::Container(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}
Container::~Container() = default;

const std::string& Container::path() const { return file_->path(); }
uint64_t Container::file_bytes() const { return file_->size(); }

void Container::Fail(ErrorKind kind, const std::string& what) const { throw Error(kind, path() + ": " + what); }

const uint8_t* Container::Record(const Table& t, uint64_t i) const {
  return index_.data() + t.offset + i * t.record_bytes;
}

std::string_view Container::String(format::StringRef ref) const {
  if (ref.length == 0) return {};
  return {reinterpret_cast<const char*>(index_.data() + strings_.offset + ref.offset), ref.length};
}

int64_t Container::Dim(uint64_t i) const { return static_cast<int64_t>(Load64(Record(dims_, i))); }

StorageInfo Container::storage(uint32_t i) const {
  format::StorageRecord r = format::DecodeStorageRecord(Record(storages_, i));
  StorageInfo s;
  s.index = i;
  s.key = String(r.key);
  s.location = String(r.location);
  s.dtype = static_cast<DType>(r.dtype);
  s.flags = r.flags;
  s.raw_bytes = r.raw_bytes;
  s.first_chunk = r.first_chunk;
  s.chunk_count = r.chunk_count;
  s.alignment = format::internal::StorageAlignment(superblock_, r.raw_bytes);
  // All-raw chunks of a storage lie back to back (a rule the reader checked), so one view does.
  s.contiguous = true;
  for (uint64_t k = 0; k < r.chunk_count && s.contiguous; ++k)
    s.contiguous = !format::IsZstd(chunk(r.first_chunk + k));
  s.data_offset = r.chunk_count ? chunk(r.first_chunk).offset : 0;
  return s;
}

format::ChunkRecord Container::chunk(uint64_t i) const { return format::DecodeChunkRecord(Record(chunks_, i)); }

TensorInfo Container::tensor(uint32_t i) const {
  format::TensorRecord r = format::DecodeTensorRecord(Record(tensors_, i));
  TensorInfo t;
  t.index = i;
  t.name = String(r.name);
  t.storage = r.storage;
  t.dtype = static_cast<DType>(r.dtype);
  t.shape.resize(r.ndim);
  t.stride.resize(r.ndim);
  for (uint32_t d = 0; d < r.ndim; ++d) {
    t.shape[d] = Dim(r.dims + d);
    t.stride[d] = Dim(r.dims + r.ndim + d);
  }
  t.storage_offset = r.storage_offset;
  t.flags = r.flags;
  t.extra = String(r.extra);
  auto extent = format::internal::ComputeTensorExtent(r.storage_offset, t.shape.data(), t.stride.data(), r.ndim,
                                                      DTypeSize(t.dtype));
  t.byte_begin = extent.begin;
  t.byte_end = extent.end;
  return t;
}

BlobInfo Container::blob(uint32_t i) const {
  format::BlobRecord r = format::DecodeBlobRecord(Record(blobs_, i));
  return {String(r.name), r.offset, r.bytes, r.checksum};
}

std::pair<std::string_view, std::string_view> Container::metadata(uint32_t i) const {
  format::MetadataRecord r = format::DecodeMetadataRecord(Record(metadata_, i));
  return {String(r.key), String(r.value)};
}

namespace {

// Binary search of an index vector sorted by the name `name_of` gives each record.
template <typename NameOf>
std::optional<uint32_t> FindSorted(const std::vector<uint32_t>& order, std::string_view name, NameOf name_of) {
  auto it = std::lower_bound(order.begin(), order.end(), name,
                             [&](uint32_t i, std::string_view n) { return name_of(i) < n; });
  if (it == order.end() || name_of(*it) != name) return std::nullopt;
  return *it;
}

}  // namespace

std::optional<uint32_t> Container::FindTensor(std::string_view name) const {
  return FindSorted(tensor_order_, name, [&](uint32_t i) { return String(format::DecodeTensorRecord(Record(tensors_, i)).name); });
}

std::optional<uint32_t> Container::FindStorage(std::string_view key) const {
  return FindSorted(storage_order_, key, [&](uint32_t i) { return String(format::DecodeStorageRecord(Record(storages_, i)).key); });
}

std::optional<BlobInfo> Container::FindBlob(std::string_view name) const {
  auto i = FindSorted(blob_order_, name, [&](uint32_t i) { return String(format::DecodeBlobRecord(Record(blobs_, i)).name); });
  if (!i) return std::nullopt;
  return blob(*i);
}

std::optional<std::string_view> Container::FindMetadata(std::string_view key) const {
  auto i = FindSorted(metadata_order_, key, [&](uint32_t i) { return String(format::DecodeMetadataRecord(Record(metadata_, i)).key); });
  if (!i) return std::nullopt;
  return metadata(*i).second;
}

std::vector<uint32_t> Container::TensorsOfStorage(uint32_t s) const {
  auto storage_of = [&](uint32_t t) { return format::DecodeTensorRecord(Record(tensors_, t)).storage; };
  auto lo = std::lower_bound(tensors_by_storage_.begin(), tensors_by_storage_.end(), s,
                             [&](uint32_t t, uint32_t v) { return storage_of(t) < v; });
  auto hi = std::upper_bound(lo, tensors_by_storage_.end(), s,
                             [&](uint32_t v, uint32_t t) { return v < storage_of(t); });
  return {lo, hi};
}

namespace {

using format::internal::ChunkFault;
using format::internal::kHashPiece;

// A per-thread buffer above this is given back after use rather than kept for the next chunk.
constexpr uint64_t kKeepScratch = 64ull << 20;

// Private memory for a zstd chunk's stored bytes (at most chunk_bytes, checked at open).
std::vector<uint8_t>& ThreadScratch() {
  thread_local std::vector<uint8_t> scratch;
  return scratch;
}

// Reads chunk `c` of `file` into dst once, every byte fed to the chunk checker: a raw chunk
// straight into dst, each piece checked where it landed (what is checked is exactly what the
// caller gets, whatever the file holds by now); a zstd chunk's stored bytes copied once into
// private memory, which the checksum and the decoder both read, the decoder writing at most
// raw_bytes into dst. The chunk's fault, if it has one; Error(kIo) when the file shrank.
std::optional<ChunkFault> ReadChunkOnce(const MappedFile& file, const format::ChunkRecord& c, uint8_t* dst, bool check) {
  thread_local format::internal::ChunkChecker checker;
  if (!format::IsZstd(c)) {
    checker.Begin(c, nullptr, check);
    const uint64_t piece = file.remote() ? c.raw_bytes : kHashPiece;  // an object: one ranged GET
    for (uint64_t at = 0; at < c.raw_bytes; at += piece) {
      const uint64_t n = std::min(piece, c.raw_bytes - at);
      file.ReadAt(c.offset + at, n, dst + at);
      checker.Feed(dst + at, n);
    }
    return checker.Finish();
  }
  std::vector<uint8_t>& stored = ThreadScratch();
  struct GiveBack {  // however the read ends
    std::vector<uint8_t>& v;
    ~GiveBack() {
      if (v.capacity() > kKeepScratch) std::vector<uint8_t>().swap(v);
    }
  } give_back{stored};
  stored.resize(c.stored_bytes);
  file.ReadAt(c.offset, c.stored_bytes, stored.data());
  return checker.Check(c, stored.data(), dst, check);
}

}  // namespace

std::vector<uint8_t> Container::CheckedBlobBytes(const BlobInfo& b) const {
  std::vector<uint8_t> bytes(b.bytes);
  file_->ReadAt(b.offset, b.bytes, bytes.data());
  if (format::Checksum(bytes.data(), bytes.size()) != b.checksum)
    throw Error(ErrorKind::kCorrupt, path() + ": blob '" + std::string(b.name) + "' fails its checksum");
  return bytes;
}

void Container::ReadChunk(uint64_t i, void* dst, bool check) const {
  const format::ChunkRecord c = chunk(i);  // from the private index: every size below is checked
  const format::internal::Refetch refetch(check ? file_->remote() : nullptr);
  for (unsigned attempt = 1;; ++attempt) {
    std::optional<ChunkFault> fault = ReadChunkOnce(*file_, c, static_cast<uint8_t*>(dst), check);
    if (!fault) return;
    if (!refetch.Again(attempt))
      throw ChunkError(ErrorKind::kCorrupt, i, fault->Describe() + refetch.Persisted(" of the chunk"));
  }
}

ErrorPlace Container::ChunkPlace(uint64_t i) const {
  format::ChunkRecord c = chunk(i);
  format::StorageRecord s = format::DecodeStorageRecord(Record(storages_, c.storage));
  ErrorPlace place;
  place.file = path();
  place.storage = String(s.key);
  for (uint32_t t : TensorsOfStorage(c.storage))
    place.tensors.emplace_back(String(format::DecodeTensorRecord(Record(tensors_, t)).name));
  place.chunk = static_cast<int64_t>(i);
  place.file_bytes = ByteRange{c.offset, c.offset + c.stored_bytes};
  uint64_t begin = (i - s.first_chunk) * superblock_.chunk_bytes;
  place.storage_bytes = ByteRange{begin, begin + c.raw_bytes};
  return place;
}

namespace {

std::string Describe(const ErrorPlace& p) {
  constexpr size_t kMaxNames = 8;
  std::string out = p.file + ": storage '" + p.storage + "' (";
  if (p.tensors.empty()) out += "no tensors";
  for (size_t k = 0; k < p.tensors.size() && k < kMaxNames; ++k) out += (k == 0 ? "tensors " : ", ") + p.tensors[k];
  if (p.tensors.size() > kMaxNames) out += ", and " + std::to_string(p.tensors.size() - kMaxNames) + " more";
  out += "), chunk " + std::to_string(p.chunk) + ", file bytes [" + std::to_string(p.file_bytes->begin) + ", " +
         std::to_string(p.file_bytes->end) + "), storage bytes [" + std::to_string(p.storage_bytes->begin) + ", " +
         std::to_string(p.storage_bytes->end) + ")";
  return out;
}

}  // namespace

std::string Container::DescribeChunk(uint64_t i) const { return Describe(ChunkPlace(i)); }

Error Container::ChunkError(ErrorKind kind, uint64_t i, const std::string& why) const {
  ErrorPlace place = ChunkPlace(i);
  std::string message = Describe(place) + ": " + why;
  return Error(kind, message, std::move(place));
}

}  // namespace zckpt
