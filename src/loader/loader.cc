// Load / LoadStorages: one destination allocation per storage, then one streaming pass.
#include <chrono>

#include "loader/plan.h"
#include "loader/stream.h"
#include "loader/tensors.h"
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

LoadResult LoadImpl(const std::string& path, c10::Device device, const LoadOptions& options, bool views) {
  auto t0 = std::chrono::steady_clock::now();
  CheckDevice(device);
  auto c = Container::Open(path);
  loader::ResolveSlotBytes(options, c->superblock().chunk_bytes);  // bad options fail before allocating
  std::optional<convert::ObjectPickle> pickle;
  if (views) {
    for (uint32_t i = 0; i < c->tensor_count(); ++i) loader::CheckViewable(*c, c->tensor(i));
    pickle = loader::VetObjectPickle(*c, options.allow_globals);  // before a byte of data is read
  }

  // One allocation per storage; every chunk of it goes to its place in that allocation.
  const uint64_t chunk_bytes = c->superblock().chunk_bytes;
  std::vector<at::Tensor> bytes;
  bytes.reserve(c->storage_count());
  loader::Destinations d(c->chunk_count());
  std::vector<int> cuda_devices;
  for (uint32_t s = 0; s < c->storage_count(); ++s) {
    StorageInfo info = c->storage(s);
    at::Tensor dst = loader::AllocateBytes(info.raw_bytes, device);
    int dev = dst.is_cuda() ? dst.get_device() : -1;
    if (dev >= 0 && cuda_devices.empty()) cuda_devices.push_back(dev);
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
  result.stats = loader::StreamChunks(*c, d, options, cuda_devices);
  loader::FinishResult(*c, bytes, views, options.object_tree ? &pickle : nullptr, t0, &result, &result.stats);
  return result;
}

}  // namespace

LoadResult Load(const std::string& path, c10::Device device, const LoadOptions& options) {
  return LoadImpl(path, device, options, true);
}

LoadResult LoadStorages(const std::string& path, c10::Device device, const LoadOptions& options) {
  return LoadImpl(path, device, options, false);
}

}  // namespace zckpt
