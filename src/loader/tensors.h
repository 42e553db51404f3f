// Torch-side helpers of the loader: zckpt dtypes as c10::ScalarType, byte storages on a
// device, and tensor records rebuilt as views the way torch's _rebuild_tensor_v2 does.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/object_pickle.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/loader.h"

namespace zckpt::loader {

// The ScalarType of `d` in the torch this was built against; Error(kUnsupported) naming `what`
// when that torch lacks it (float8_e8m0fnu before 2.7, ...).
c10::ScalarType ToScalarType(DType d, const std::string& what);

// Error(kUnsupported) unless tensor record `t` can become a plain view (not quantized, dtype
// known to this torch). Called for every record before a byte is read.
void CheckViewable(const Container& c, const TensorInfo& t);

// A 1-D uint8 tensor of `bytes` on `device` (one allocation). On the CPU, from
// kBlockAlignedFrom bytes up, aligned to the O_DIRECT block (kDirectIoAlign, plan.h: a block
// size, not the page size) so it can be a target for O_DIRECT reads.
inline constexpr uint64_t kBlockAlignedFrom = 64 << 10;
at::Tensor AllocateBytes(uint64_t bytes, c10::Device device);
// A 1-D uint8 tensor over all of `storage`.
at::Tensor BytesOf(const c10::Storage& storage);

// `t` viewed over `storage` with its dtype, shape and stride, at element `storage_offset`
// (t.storage_offset, or shifted when `storage` holds only the tensor's bytes); conj/neg bits and
// requires_grad applied as torch's _rebuild_tensor_v2 does.
at::Tensor MakeView(const c10::Storage& storage, const TensorInfo& t, int64_t storage_offset);

// Runs `f`, turning torch's c10::Error (allocation, CUDA init, copy_) into Error(kIo), and its
// c10::OutOfMemoryError (the caching allocator, or the CPU one) into Error(kOutOfMemory).
template <typename F>
auto WithTorchErrors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::OutOfMemoryError& e) {
    throw Error(ErrorKind::kOutOfMemory, std::string("torch: ") + e.what_without_backtrace());
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kIo, std::string("torch: ") + e.what_without_backtrace());
  }
}

// The container's object pickle read under the allowlist plus `allow_globals` and checked against
// the index (checkpoint::ReadObjectPickle): what a load that gives tensors by name does before it
// reads any data. Errors name the file.
std::optional<checkpoint::ObjectPickle> VetObjectPickle(const Container& c, const std::vector<std::string>& allow_globals);

// Fills out->storages_by_key from `bytes` (one uint8 tensor per storage index) and, with
// `views`, out->tensors/meta (TensorSet::add) with a view per tensor record and, with `tree` (the vetted
// pickle, or nullopt for a container without one) out->tree (object_tree.h).
void BuildTensorSet(const Container& c, const std::vector<at::Tensor>& bytes, bool views, TensorSet* out,
                    const std::optional<checkpoint::ObjectPickle>* tree = nullptr);

// The end Load and Map share: the tensor set over `bytes`, then the counts and the wall time
// since `t0` into `stats` (LoadStats or MapStats).
template <typename Stats>
void FinishResult(const Container& c, const std::vector<at::Tensor>& bytes, bool views,
                  const std::optional<checkpoint::ObjectPickle>* tree, std::chrono::steady_clock::time_point t0,
                  TensorSet* out, Stats* stats) {
  WithTorchErrors([&] { BuildTensorSet(c, bytes, views, out, tree); });
  stats->storages = c.storage_count();
  stats->tensors = out->tensors.size();
  stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace zckpt::loader
