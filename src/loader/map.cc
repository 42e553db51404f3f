// Map: CPU tensors over MappedStorages (zckpt/load_ranges.h): raw storages alias a copy-on-write
// mapping of the file, zstd ones are decoded; with verify, every raw chunk hashed where it lies
// in the mapping first. Each tensor's storage holds what keeps its own bytes alone.
#include <c10/core/Allocator.h>

#include <chrono>
#include <memory>
#include <vector>

#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/load_options.h"
#include "zckpt/load_ranges.h"
#include "zckpt/loader.h"

namespace zckpt {

namespace {

void DropKeeper(void* ctx) { delete static_cast<std::shared_ptr<const void>*>(ctx); }

// A storage of MappedStorages as a CPU byte tensor holding only what keeps that storage's bytes.
at::Tensor StorageBytes(const MappedStorages& m, uint32_t storage, uint64_t bytes) {
  c10::DataPtr ptr(m.data(storage), new std::shared_ptr<const void>(m.keeper(storage)), &DropKeeper,
                   c10::Device(c10::kCPU));
  c10::Storage s(c10::Storage::use_byte_size_t(), static_cast<size_t>(bytes), std::move(ptr), nullptr, false);
  return loader::BytesOf(s);
}

MapResult MapImpl(const Container& c, bool views, const MapOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  std::optional<checkpoint::ObjectPickle> pickle;
  if (views) {
    for (uint32_t i = 0; i < c.tensor_count(); ++i) loader::CheckViewable(c, c.tensor(i));
    pickle = loader::VetObjectPickle(c, options.allow_globals);
  }
  MappedStorages mapped(c, options.verify, options.threads);
  MapResult result;
  result.stats.mapped_bytes = mapped.mapped_bytes();
  result.stats.decoded_bytes = mapped.decoded_bytes();
  if (options.verify) result.stats.verified_bytes = mapped.mapped_bytes();
  std::vector<at::Tensor> bytes;
  bytes.reserve(c.storage_count());
  for (uint32_t s = 0; s < c.storage_count(); ++s)
    bytes.push_back(loader::WithTorchErrors([&] { return StorageBytes(mapped, s, c.storage(s).raw_bytes); }));
  loader::FinishResult(c, bytes, views, options.object_tree ? &pickle : nullptr, t0, &result, &result.stats);
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
