// Load / LoadStorages: one destination allocation per storage, then one streaming pass.
#include <algorithm>
#include <chrono>

#include "loader/plan.h"
#include "loader/stream.h"
#include "loader/tensors.h"
#include "loader/torch_cuda.h"
#include "zckpt/container.h"
#include "zckpt/loader.h"

namespace zckpt {

namespace {

void CheckDevice(c10::Device device) {
  if (device.is_cpu()) return;
#if ZCKPT_WITH_CUDA
  if (device.is_cuda()) return;
#endif
  throw Error(device.is_cuda() ? ErrorKind::kUnsupported : ErrorKind::kInvalidArgument,
              "cannot load to device " + device.str() + (device.is_cuda() ? ": zckpt was built without CUDA" : ""));
}

// `device_of(container, storage index)` says where each storage goes.
template <typename DeviceOf>
LoadResult LoadImpl(const Container& container, DeviceOf device_of, const LoadOptions& options, bool views) {
  auto t0 = std::chrono::steady_clock::now();
  const Container* c = &container;
  for (uint32_t s = 0; s < c->storage_count(); ++s) CheckDevice(device_of(*c, s));
  loader::ResolveContainerLoad(options, *c);  // bad options fail before allocating
  std::optional<checkpoint::ObjectPickle> pickle;
  if (views) {
    for (uint32_t i = 0; i < c->tensor_count(); ++i) loader::CheckViewable(*c, c->tensor(i));
    pickle = loader::VetObjectPickle(*c, options.allow_globals);  // before a byte of data is read
  }

  // One allocation per storage, each on its own device; every chunk of it goes to its place in
  // that allocation. Nothing is allocated anywhere else first: each device holds its storages only.
  const uint64_t chunk_bytes = c->superblock().chunk_bytes;
  std::vector<at::Tensor> bytes;
  bytes.reserve(c->storage_count());
  loader::Destinations d(c->chunk_count());
  std::vector<int> cuda_devices;
  for (uint32_t s = 0; s < c->storage_count(); ++s) {
    StorageInfo info = c->storage(s);
    at::Tensor dst = loader::AllocateBytes(info.raw_bytes, device_of(*c, s));
    int dev = dst.is_cuda() ? dst.get_device() : -1;
    if (dev >= 0 && std::find(cuda_devices.begin(), cuda_devices.end(), dev) == cuda_devices.end())
      cuda_devices.push_back(dev);
    auto* base = static_cast<uint8_t*>(dst.data_ptr());
    for (uint64_t k = 0; k < info.chunk_count; ++k) {
      loader::Piece p;
      p.bytes = c->chunk(info.first_chunk + k).raw_bytes;
      p.dst = base + k * chunk_bytes;
      p.device = dev;
      d.Add(info.first_chunk + k, p);
    }
    bytes.push_back(std::move(dst));
  }
  d.Finish();

  LoadResult result;
  result.stats = loader::StreamChunksForTorch(*c, d, options, cuda_devices);
  loader::FinishResult(*c, bytes, views, options.object_tree ? &pickle : nullptr, t0, &result, &result.stats);
  return result;
}

}  // namespace

LoadResult Load(const Container& c, c10::Device device, const LoadOptions& options) {
  return LoadImpl(c, [&](const Container&, uint32_t) { return device; }, options, true);
}

LoadResult Load(const std::string& path, c10::Device device, const LoadOptions& options) {
  return Load(*Container::Open(path), device, options);
}

LoadResult LoadStorages(const std::string& path, c10::Device device, const LoadOptions& options) {
  return LoadImpl(*Container::Open(path), [&](const Container&, uint32_t) { return device; }, options, false);
}

LoadResult LoadStorages(const Container& c, const std::map<std::string, c10::Device>& devices, c10::Device fallback,
                        const LoadOptions& options) {
  auto device_of = [&](const Container& c, uint32_t s) {
    auto it = devices.find(std::string(c.storage(s).key));
    return it == devices.end() ? fallback : it->second;
  };
  return LoadImpl(c, device_of, options, false);
}

LoadResult LoadStorages(const std::string& path, const std::map<std::string, c10::Device>& devices,
                        c10::Device fallback, const LoadOptions& options) {
  return LoadStorages(*Container::Open(path), devices, fallback, options);
}

}  // namespace zckpt
