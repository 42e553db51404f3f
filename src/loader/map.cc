// Map: CPU tensors aliasing a copy-on-write mapping of the file; with verify, every raw chunk
// hashed where it lies in the mapping first.
#include <c10/core/Allocator.h>
#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "common/mapped_file.h"
#include "format/container_file.h"
#include "loader/map_verify.h"
#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/loader.h"

namespace zckpt {

using format::internal::ContainerFile;

namespace {

// The read-write private mapping every mapped storage aliases; unmapped when the last storage
// (hence the last tensor viewing it) is freed. Made from the container's own descriptor: the
// file whose index was validated, whatever the path names by now.
//
// Like torch.load(mmap=True), the views read the file when touched: bytes another process
// rewrites later show through (until a page is written: copy on write), and touching a page
// after another process truncated the file raises SIGBUS (include/zckpt/loader.h, Map).
class Mapping {
 public:
  explicit Mapping(const Container& c) : size_(c.file_bytes()) {
    if (ContainerFile::Of(c).remote())
      throw Error(ErrorKind::kInvalidArgument, c.path() + ": an object in object storage cannot be mapped: load it "
                                                          "(zckpt.load without mmap=True), or download it first");
    if (ContainerFile::Of(c).fd() < 0) throw Error(ErrorKind::kInvalidArgument, c.path() + ": a container opened from memory cannot be mapped");
    // PROT_WRITE + MAP_PRIVATE: tensors may be written like any CPU tensor; the written pages are
    // copied on write and the file never changes (torch.load(mmap=True) does the same).
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, ContainerFile::Of(c).fd(), 0);
    if (p == MAP_FAILED) throw Error(ErrorKind::kIo, "cannot mmap " + c.path() + ": " + std::strerror(errno));
    data_ = static_cast<uint8_t*>(p);
  }
  ~Mapping() { munmap(data_, size_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

void DropReference(void* ctx) { delete static_cast<std::shared_ptr<Mapping>*>(ctx); }

at::Tensor MappedBytes(const std::shared_ptr<Mapping>& m, uint64_t offset, uint64_t bytes) {
  c10::DataPtr ptr(m->data() + offset, new std::shared_ptr<Mapping>(m), &DropReference, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(bytes), std::move(ptr), nullptr, false);
  return loader::BytesOf(storage);
}

MapResult MapImpl(const Container& container, bool views, const MapOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  const Container* c = &container;
  std::optional<checkpoint::ObjectPickle> pickle;
  if (views) {
    for (uint32_t i = 0; i < c->tensor_count(); ++i) loader::CheckViewable(*c, c->tensor(i));
    pickle = loader::VetObjectPickle(*c, options.allow_globals);
  }
  auto mapping = std::make_shared<Mapping>(*c);
  MapResult result;
  std::vector<at::Tensor> bytes;
  bytes.reserve(c->storage_count());
  const uint64_t chunk_bytes = c->superblock().chunk_bytes;
  std::vector<uint64_t> to_verify;
  for (uint32_t s = 0; s < c->storage_count(); ++s) {
    StorageInfo info = c->storage(s);
    if (info.raw_bytes != 0 && info.contiguous) {
      bytes.push_back(loader::WithTorchErrors([&] { return MappedBytes(mapping, info.data_offset, info.raw_bytes); }));
      result.stats.mapped_bytes += info.raw_bytes;
      if (options.verify) {
        for (uint64_t k = 0; k < info.chunk_count; ++k) to_verify.push_back(info.first_chunk + k);
        result.stats.verified_bytes += info.raw_bytes;
      }
      continue;
    }
    // zstd chunks cannot alias the file: decode (and check) them into memory of their own.
    at::Tensor owned = loader::AllocateBytes(info.raw_bytes, c10::Device(c10::kCPU));
    auto* base = static_cast<uint8_t*>(owned.data_ptr());
    for (uint64_t k = 0; k < info.chunk_count; ++k) c->ReadChunk(info.first_chunk + k, base + k * chunk_bytes, true);
    result.stats.decoded_bytes += info.raw_bytes;
    bytes.push_back(std::move(owned));
  }
  if (!to_verify.empty()) loader::VerifyMapped(*c, mapping->data(), to_verify, options.threads);
  loader::FinishResult(*c, bytes, views, options.object_tree ? &pickle : nullptr, t0, &result, &result.stats);
  return result;
}

}  // namespace

MapResult Map(const Container& c, const MapOptions& options) { return MapImpl(c, true, options); }

MapResult Map(const std::string& path, const MapOptions& options) { return MapImpl(*Container::Open(path), true, options); }

MapResult MapStorages(const Container& c, const MapOptions& options) { return MapImpl(c, false, options); }

MapResult MapStorages(const std::string& path, const MapOptions& options) {
  return MapImpl(*Container::Open(path), false, options);
}

}  // namespace zckpt
