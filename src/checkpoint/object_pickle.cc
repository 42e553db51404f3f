#include "checkpoint/object_pickle.h"

#include <unordered_map>

#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::checkpoint {

namespace {

// Disagreements listed in a thrown message: the first ones, then a count.
constexpr size_t kListed = 4;

std::string Dims(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// A disagreement about `about` (its storage or tensor, its message the subject: "tensor 'w'").
void Add(std::vector<Disagreement>& out, const Disagreement& about, const std::string& why) {
  out.push_back({about.storage, about.tensor, about.message + ": " + why});
}

template <typename T>
void Compare(std::vector<Disagreement>& out, const Disagreement& about, const char* field, const T& pickle_side,
             const T& index_side, std::string (*show)(const T&)) {
  if (pickle_side == index_side) return;
  Add(out, about, std::string(field) + " " + show(pickle_side) + " in the pickle, " + show(index_side) + " in the index");
}

Disagreement AboutStorage(const std::string& key) { return {key, "", "storage '" + key + "'"}; }
Disagreement AboutTensor(const std::string& name) { return {"", name, "tensor '" + name + "'"}; }

std::string Num(const uint64_t& v) { return std::to_string(v); }
std::string Text(const std::string& v) { return "'" + v + "'"; }
std::string Name(const DType& d) { return std::string(DTypeName(d)); }
std::string Flag(const bool& b) { return b ? "set" : "unset"; }
std::string Bits(const uint32_t& v) { return std::to_string(v); }

}  // namespace

pickle::UnpickleOptions PickleReadOptions::Unpickle() const {
  pickle::UnpickleOptions o;
  o.globals = globals;
  o.allow_globals = allow_globals;
  return o;
}

uint32_t IndexFlags(const pickle::TorchTensor& t) {
  return (t.requires_grad ? format::kTensorRequiresGrad : 0) | (t.is_parameter ? format::kTensorParameter : 0) |
         (t.conj ? format::kTensorConj : 0) | (t.neg ? format::kTensorNeg : 0) |
         (t.dtensor_local ? format::kTensorDTensorLocal : 0) | (t.sharded_local ? format::kTensorShardedLocal : 0) |
         (t.quantized ? format::kTensorQuantized : 0) | (t.internal ? format::kTensorInternal : 0);
}

std::vector<Disagreement> IndexDisagreements(const Container& c, const pickle::TorchPickle& model) {
  std::vector<Disagreement> out;
  // Storages: one per key on both sides.
  for (const pickle::TorchStorage& s : model.storages) {
    const Disagreement what = AboutStorage(s.key);
    auto index = c.FindStorage(s.key);
    if (!index) {
      Add(out, what, "named by the pickle, absent from the index");
      continue;
    }
    StorageInfo info = c.storage(*index);
    Compare(out, what, "dtype", s.dtype, info.dtype, Name);
    Compare(out, what, "untyped", s.untyped, (info.flags & format::kStorageUntyped) != 0, Flag);
    Compare(out, what, "location", s.location, std::string(info.location), Text);
    Compare(out, what, "byte size", s.nbytes, info.raw_bytes, Num);
  }
  if (c.storage_count() != model.storages.size()) {
    std::unordered_map<std::string_view, bool> named;
    for (const pickle::TorchStorage& s : model.storages) named[s.key] = true;
    for (uint32_t i = 0; i < c.storage_count(); ++i)
      if (!named.count(c.storage(i).key))
        Add(out, AboutStorage(std::string(c.storage(i).key)), "in the index, not named by the pickle");
  }
  // Tensors: one per name on both sides.
  for (const pickle::TorchTensor& t : model.tensors) {
    const Disagreement what = AboutTensor(t.name);
    auto index = c.FindTensor(t.name);
    if (!index) {
      Add(out, what, "described by the pickle, absent from the index");
      continue;
    }
    TensorInfo info = c.tensor(*index);
    const std::string& key = model.storages.at(t.storage).key;
    Compare(out, what, "storage", key, std::string(c.storage(info.storage).key), Text);
    Compare(out, what, "dtype", t.dtype, info.dtype, Name);
    Compare(out, what, "shape", t.shape, info.shape, Dims);
    Compare(out, what, "stride", t.stride, info.stride, Dims);
    if (t.storage_offset < 0) Add(out, what, "negative storage offset in the pickle");
    else Compare(out, what, "storage offset", static_cast<uint64_t>(t.storage_offset), info.storage_offset, Num);
    Compare(out, what, "flags", IndexFlags(t), info.flags, Bits);
    Compare(out, what, "extra record", t.extra, std::string(info.extra), Text);
  }
  if (c.tensor_count() != model.tensors.size()) {
    std::unordered_map<std::string_view, bool> named;
    for (const pickle::TorchTensor& t : model.tensors) named[t.name] = true;
    for (uint32_t i = 0; i < c.tensor_count(); ++i)
      if (!named.count(c.tensor(i).name))
        Add(out, AboutTensor(std::string(c.tensor(i).name)), "in the index, not described by the pickle");
  }
  return out;
}

std::optional<ObjectPickle> ReadObjectPickle(const Container& c, const PickleReadOptions& options) {
  auto blob = c.FindBlob(format::kObjectPickleBlob);
  if (!blob) return std::nullopt;
  ObjectPickle out;
  out.bytes = c.CheckedBlobBytes(*blob);  // kCorrupt naming the file and blob
  try {
    out.tree = pickle::Unpickle(out.bytes, options.Unpickle());
    out.model = pickle::InterpretTorchPickle(out.tree);
  } catch (const Error& e) {
    throw Error(e.kind(), c.path() + ": object pickle: " + e.what());
  }
  std::vector<Disagreement> disagreements = IndexDisagreements(c, out.model);
  if (!disagreements.empty()) {
    std::string msg = c.path() + ": the object pickle and the index disagree: ";
    for (size_t i = 0; i < disagreements.size() && i < kListed; ++i) msg += (i ? "; " : "") + disagreements[i].message;
    if (disagreements.size() > kListed) msg += "; and " + std::to_string(disagreements.size() - kListed) + " more";
    throw Error(ErrorKind::kCorrupt, msg);
  }
  return out;
}

std::vector<VerifyProblem> ObjectPickleProblems(const Container& c) {
  auto blob = c.FindBlob(format::kObjectPickleBlob);
  if (!blob) return {};
  PickleReadOptions describe;
  describe.globals = pickle::GlobalPolicy::kDenyListOnly;
  pickle::TorchPickle model;
  ErrorPlace file;
  file.file = c.path();
  try {
    std::vector<uint8_t> bytes = c.CheckedBlobBytes(*blob);
    model = pickle::InterpretTorchPickle(pickle::Unpickle(bytes, describe.Unpickle()));
  } catch (const Error& e) {
    // Damaged, malformed or refused is a finding; anything else (an unsupported dtype) means
    // the file cannot be checked, as for the format layer.
    if (!IsFinding(e.kind())) throw;
    std::string what = e.what();
    if (what.rfind(c.path(), 0) != 0) what = c.path() + ": object pickle: " + what;
    return {{e.kind(), what, file}};
  }
  std::vector<VerifyProblem> out;
  for (Disagreement& d : IndexDisagreements(c, model)) {
    ErrorPlace place = file;
    place.storage = std::move(d.storage);
    if (!d.tensor.empty()) place.tensors.push_back(std::move(d.tensor));
    out.push_back({ErrorKind::kCorrupt, c.path() + ": the object pickle and the index disagree: " + d.message,
                   std::move(place)});
  }
  return out;
}

}  // namespace zckpt::checkpoint
