// Map: CPU tensors aliasing a copy-on-write mapping of the file; with verify, every raw chunk
// hashed where it lies in the mapping first.
#include <c10/core/Allocator.h>

#include <chrono>
#include <memory>
#include <vector>

#include "loader/map_verify.h"
#include "loader/mapping.h"
#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/loader.h"

namespace zckpt {

namespace {

using loader::Mapping;

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
