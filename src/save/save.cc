// zckpt::Save / SavePickled: the torch side of a save (LibTorch's pickler for Save, torch's zip
// writer for the archive's small records, torch's current streams and device guard for CUDA
// storages); the writing itself, and the CUDA storages' pinned ring, are the torch-free
// save::SavePickledBytes (save_pickled.cc) and device reader (device_reader_cuda.cc).
#include "zckpt/save.h"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickler.h>

#if ZCKPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <bit>
#include <set>
#include <unordered_map>

#include "save/archive_records.h"
#include "save/device_reader.h"
#include "save/save_pickled.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

[[noreturn]] void Invalid(const std::string& what) { throw Error(ErrorKind::kInvalidArgument, what); }

// save::NamingPath, torch's own errors (c10::Error) as kIo naming `path` too.
template <typename F>
auto NamingPathAndTorch(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return save::NamingPath(path, f);
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kIo, path + ": torch: " + e.what_without_backtrace());
  }
}

// Each supplied storage as the torch-free core takes it: a whole 1-D uint8 tensor on the CPU or a
// CUDA device, by address (its size is checked against the pickle there).
std::map<std::string, save::StorageBytes> StorageBytesOf(const std::string& path,
                                                         const std::map<std::string, at::Tensor>& storages) {
  std::map<std::string, save::StorageBytes> out;
  for (const auto& [key, t] : storages) {
    if (!t.defined() || t.scalar_type() != at::kByte || t.dim() != 1 || !t.is_contiguous())
      Invalid(path + ": storage '" + key + "' must be given as a contiguous 1-D uint8 tensor");
    if (!t.device().is_cpu() && !t.device().is_cuda())
      throw Error(ErrorKind::kUnsupported, path + ": storage '" + key + "' is on " + t.device().str() +
                                               " (zckpt saves from cpu and cuda)");
    out[key] = {static_cast<const uint8_t*>(t.const_data_ptr()), static_cast<uint64_t>(t.numel()),
                t.device().is_cuda() ? t.device().index() : -1};
  }
  return out;
}

}  // namespace

SaveStats SavePickled(const std::string& path, const PickledCheckpoint& checkpoint, const SaveOptions& options) {
  return NamingPathAndTorch(path, [&] {
    save::PickledBytes bytes;
    bytes.pickle = checkpoint.pickle;
    bytes.storages = StorageBytesOf(path, checkpoint.storages);
    save::ArchiveRecords records = save::MakeArchiveRecords(checkpoint.pickle, checkpoint.records);
    bytes.records_before = std::move(records.before);
    bytes.records_after = std::move(records.after);
    bytes.record_bytes = std::move(records.bytes);
    bytes.prefix = checkpoint.prefix;
    bytes.metadata = checkpoint.metadata;
#if ZCKPT_WITH_CUDA
    // CUDA storages: the copies wait for torch's current stream on each device, and torch's guard
    // gives the caller its device back afterwards.
    c10::cuda::OptionalCUDAGuard guard;
    save::StreamToWaitFor wait_for = [&guard](int device) {
      guard.set_index(static_cast<c10::DeviceIndex>(device));
      return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    };
#else
    save::StreamToWaitFor wait_for;  // a CPU torch has no CUDA tensors to save
#endif
    return save::SavePickledBytes(path, bytes, options, [&] {
      return save::MakeCudaReader(options.cuda_slots, options.cuda_slot_bytes, wait_for);
    });
  });
}

namespace {

// torch.save's rule: one storage, one dtype (torch.load would give every view the first one's).
void CheckSaveable(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::set<std::string> names;
  std::unordered_map<const void*, std::pair<at::ScalarType, std::string>> storage_dtype;
  for (const auto& [name, t] : tensors) {
    if (!names.insert(name).second) Invalid(path + ": tensor name '" + name + "' given twice");
    if (!t.defined()) Invalid(path + ": tensor '" + name + "' is undefined");
    if (t.layout() != at::kStrided || t.is_quantized() || t.is_nested() || t.is_meta())
      Invalid(path + ": tensor '" + name + "' is not a dense strided tensor with data (zckpt::Save takes those)");
    if (!t.device().is_cpu() && !t.device().is_cuda())
      throw Error(ErrorKind::kUnsupported, path + ": tensor '" + name + "' is on " + t.device().str() +
                                               " (zckpt saves from cpu and cuda)");
    const void* impl = t.storage().unsafeGetStorageImpl();
    auto [it, inserted] = storage_dtype.emplace(impl, std::make_pair(t.scalar_type(), name));
    if (!inserted && it->second.first != t.scalar_type())
      Invalid(path + ": tensors '" + it->second.second + "' and '" + name +
              "' view one storage as different dtypes (torch.save refuses this too)");
  }
}

}  // namespace

SaveStats Save(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
               const std::map<std::string, std::string>& metadata, const SaveOptions& options) {
  PickledCheckpoint checkpoint;
  NamingPathAndTorch(path, [&] {
    CheckSaveable(path, tensors);
    // A plain dict {name: tensor}, pickled by LibTorch's own pickler the way torch.save pickles
    // tensors (_rebuild_tensor_v2 + ('storage', torch.FloatStorage, key, location, numel)), no
    // TorchScript type tags (torch.load's weights-only unpickler refuses them).
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, t] : tensors) dict.insert(name, t);
    torch::jit::Pickler pickler([&](const char* data, size_t n) { checkpoint.pickle.append(data, n); },
                                /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                                /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(dict);
    pickler.stop();
    // The pickler keys storages "0", "1", ... in the order it met them (tensorData()[i] is a
    // tensor of storage "i").
    const std::vector<at::Tensor>& by_key = pickler.tensorData();
    for (size_t i = 0; i < by_key.size(); ++i) {
      const c10::Storage& storage = by_key[i].storage();
      at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(by_key[i].device()));
      bytes.set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
      checkpoint.storages.emplace(std::to_string(i), bytes);
    }
  });
  // What torch.save writes between data.pkl and the storages (torch.serialization._save).
  checkpoint.records = {{".format_version", "1"},
                        {".storage_alignment", "64"},
                        {"byteorder", std::endian::native == std::endian::little ? "little" : "big"}};
  checkpoint.metadata = metadata;
  return SavePickled(path, checkpoint, options);
}

}  // namespace zckpt
