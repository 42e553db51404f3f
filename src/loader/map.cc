// Map: CPU tensors aliasing a copy-on-write mapping of the file; nothing is read.
#include <c10/core/Allocator.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/loader.h"

namespace zckpt {

namespace {

// The read-write private mapping every mapped storage aliases; unmapped when the last storage
// (hence the last tensor viewing it) is freed.
class Mapping {
 public:
  explicit Mapping(const std::string& path, uint64_t expected_bytes) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(ErrorKind::kIo, "cannot open " + path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != expected_bytes) {
      ::close(fd);
      throw Error(ErrorKind::kIo, path + " changed while being opened");
    }
    // PROT_WRITE + MAP_PRIVATE: tensors may be written like any CPU tensor; the written pages are
    // copied on write and the file never changes (torch.load(mmap=True) does the same).
    void* p = mmap(nullptr, expected_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int saved = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw Error(ErrorKind::kIo, "cannot mmap " + path + ": " + std::strerror(saved));
    data_ = static_cast<uint8_t*>(p);
    size_ = expected_bytes;
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

MapResult MapImpl(const std::string& path, bool views, const MapOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  auto c = Container::Open(path);
  std::optional<convert::ObjectPickle> pickle;
  if (views) {
    for (uint32_t i = 0; i < c->tensor_count(); ++i) loader::CheckViewable(*c, c->tensor(i));
    pickle = loader::VetObjectPickle(*c, options.allow_globals);
  }
  auto mapping = std::make_shared<Mapping>(path, c->file_bytes());
  MapResult result;
  std::vector<at::Tensor> bytes;
  bytes.reserve(c->storage_count());
  const uint64_t chunk_bytes = c->superblock().chunk_bytes;
  for (uint32_t s = 0; s < c->storage_count(); ++s) {
    StorageInfo info = c->storage(s);
    if (info.raw_bytes != 0 && info.contiguous) {
      bytes.push_back(loader::WithTorchErrors([&] { return MappedBytes(mapping, info.data_offset, info.raw_bytes); }));
      result.stats.mapped_bytes += info.raw_bytes;
      continue;
    }
    // zstd chunks cannot alias the file: decode (and check) them into memory of their own.
    at::Tensor owned = loader::AllocateBytes(info.raw_bytes, c10::Device(c10::kCPU));
    auto* base = static_cast<uint8_t*>(owned.data_ptr());
    for (uint64_t k = 0; k < info.chunk_count; ++k) c->ReadChunk(info.first_chunk + k, base + k * chunk_bytes, true);
    result.stats.decoded_bytes += info.raw_bytes;
    bytes.push_back(std::move(owned));
  }
  loader::FinishResult(*c, bytes, views, options.object_tree ? &pickle : nullptr, t0, &result, &result.stats);
  return result;
}

}  // namespace

MapResult Map(const std::string& path, const MapOptions& options) { return MapImpl(path, true, options); }

MapResult MapStorages(const std::string& path) { return MapImpl(path, false, {}); }

}  // namespace zckpt
