// zckpt::Save / SavePickled: a torch.save pickle and its storages -> container, through the
// converter's own code (checkpoint::WriteZipContainer) with the storages read from memory instead
// of from a `.pt` file.
#include "zckpt/save.h"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <bit>
#include <chrono>
#include <set>
#include <unordered_map>

#include "checkpoint/zip_container.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "save/archive_records.h"
#include "save/device_reader.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

[[noreturn]] void Invalid(const std::string& what) { throw Error(ErrorKind::kInvalidArgument, what); }

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// The checkpoint's side of checkpoint::ZipParts: records from memory, storages from tensors. CPU
// storages are handed to the writer from their own memory (it copies chunk by chunk into its
// hashing pipeline, never the whole storage); CUDA storages go through the pinned ring.
class TensorParts final : public checkpoint::ZipParts {
 public:
  TensorParts(const PickledCheckpoint& checkpoint, const save::ArchiveRecords& records, const SaveOptions& options,
              const std::string& path, SaveStats& stats)
      : checkpoint_(checkpoint), records_(records), options_(options), path_(path), stats_(stats) {}

  std::span<const uint8_t> Record(const std::string& name) override {
    auto it = records_.bytes.find(name);
    if (it == records_.bytes.end()) Invalid(path_ + ": no bytes for record '" + name + "'");
    return AsBytes(it->second);
  }

  void WriteStorage(const pickle::TorchStorage& s, ContainerWriter& writer) override {
    const at::Tensor& t = checkpoint_.storages.at(s.key);  // checked by CheckStorages
    NewStorage ns = checkpoint::StorageRecordOf(s);
    const auto* data = static_cast<const uint8_t*>(t.const_data_ptr());
    if (t.device().is_cpu()) {
      writer.AddStorage(ns, std::span<const uint8_t>(data, s.nbytes));
      return;
    }
    if (!reader_) {
      reader_ = save::MakeCudaReader(options_.cuda_slots, options_.cuda_slot_bytes);
    }
    writer.BeginStorage(ns, s.nbytes);
    reader_->Read(data, s.nbytes, t.device().index(), [&](std::span<const uint8_t> piece) { writer.AppendStorage(piece); });
    writer.EndStorage();
    stats_.cuda_bytes += s.nbytes;
    stats_.cuda_ring_bytes = reader_->ring_bytes();
  }

 private:
  const PickledCheckpoint& checkpoint_;
  const save::ArchiveRecords& records_;
  const SaveOptions& options_;
  const std::string& path_;
  SaveStats& stats_;
  std::unique_ptr<save::DeviceReader> reader_;
};

// Every storage the pickle names is supplied, as a whole 1-D uint8 tensor of the size the pickle
// claims, on a device the parts can read; nothing else is supplied.
void CheckStorages(const std::string& path, const pickle::TorchPickle& model, const PickledCheckpoint& checkpoint) {
  std::set<std::string> named;
  for (const pickle::TorchStorage& s : model.storages) {
    named.insert(s.key);
    auto it = checkpoint.storages.find(s.key);
    if (it == checkpoint.storages.end()) Invalid(path + ": the pickle names storage '" + s.key + "', which was not supplied");
    const at::Tensor& t = it->second;
    if (!t.defined() || t.scalar_type() != at::kByte || t.dim() != 1 || !t.is_contiguous())
      Invalid(path + ": storage '" + s.key + "' must be given as a contiguous 1-D uint8 tensor");
    if (static_cast<uint64_t>(t.numel()) != s.nbytes)
      Invalid(path + ": storage '" + s.key + "' holds " + std::to_string(t.numel()) + " bytes but the pickle claims " +
              std::to_string(s.nbytes) + " (" + std::to_string(s.numel) + " x " + std::string(DTypeName(s.dtype)) + ")");
    if (!t.device().is_cpu() && !t.device().is_cuda())
      throw Error(ErrorKind::kUnsupported, path + ": storage '" + s.key + "' is on " + t.device().str() +
                                               " (zckpt saves from cpu and cuda)");
  }
  for (const auto& [key, t] : checkpoint.storages)
    if (!named.count(key)) Invalid(path + ": storage '" + key + "' was supplied but the pickle does not name it");
}

void CheckMetadata(const std::string& path, const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata)
    if (key.rfind("zckpt.", 0) == 0) Invalid(path + ": metadata key '" + key + "' is reserved (zckpt.*)");
}

// Names every error after the destination, as the converter names its source.
template <typename F>
auto NamingPath(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.find(path) == std::string::npos) what = path + ": " + what;
    throw Error(e.kind(), what);
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kIo, path + ": torch: " + e.what_without_backtrace());
  }
}

}  // namespace

SaveStats SavePickled(const std::string& path, const PickledCheckpoint& checkpoint, const SaveOptions& options) {
  return NamingPath(path, [&] {
    auto t0 = std::chrono::steady_clock::now();
    CheckMetadata(path, checkpoint.metadata);
    // The converter's reading of the pickle: storages and tensor records exactly as `zckpt
    // convert` derives them from the equivalent .pt file.
    pickle::UnpickleResult tree = pickle::Unpickle(AsBytes(checkpoint.pickle));
    pickle::TorchPickle model = pickle::InterpretTorchPickle(tree);
    CheckStorages(path, model, checkpoint);
    std::vector<std::string> keys;
    for (const pickle::TorchStorage& s : model.storages) keys.push_back(s.key);
    save::ArchiveRecords records = save::MakeArchiveRecords(checkpoint.pickle, checkpoint.records, keys);

    SaveStats stats;
    ContainerWriter writer(path, options.writer);
    TensorParts parts(checkpoint, records, options, path, stats);
    checkpoint::ZipCounts counts = checkpoint::WriteZipContainer(
        writer, model, records.names, checkpoint.prefix.empty() ? save::ArchivePrefix(path) : checkpoint.prefix, parts,
        ErrorKind::kInvalidArgument);
    for (const auto& [key, value] : checkpoint.metadata) writer.SetMetadata(key, value);
    stats.written = writer.Commit();
    stats.storages = counts.storages;
    stats.tensors = counts.tensors;
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return stats;
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
  NamingPath(path, [&] {
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
