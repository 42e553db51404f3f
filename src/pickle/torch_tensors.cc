#include "pickle/torch_tensors.h"

#include "pickle/json_writer.h"
#include "pickle/torch_distributed.h"
#include "pickle/torch_values.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

namespace {

// Parameters of parameters of subclasses: real files nest three deep at most.
constexpr int kMaxRebuildNesting = 16;

[[noreturn]] void Corrupt(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kCorrupt, "tensor '" + path + "': " + what);
}

const Value* Arg(const std::vector<Value*>& a, size_t i) { return i < a.size() ? a[i] : nullptr; }

bool IsRebuild(const Value* fn, std::string_view name) { return IsTorchGlobal(fn) && GlobalName(fn) == name; }

std::vector<int64_t> IntList(const Value* v, const std::string& path, const char* what) {
  auto list = AsIntList(v);
  if (!list) Corrupt(path, std::string(what) + " is not a tuple of at most " + std::to_string(kMaxListInts) + " ints");
  return *list;
}

// Checks that every element the tensor can address lies inside the bytes its storage
// reference allows, folding a legacy view's start into the offset. Overflow-safe.
void PlaceInStorage(TorchTensor& t, const StorageRef& ref, const std::string& path) {
  const uint64_t element = DTypeSize(t.dtype);
  if (element == 0) Corrupt(path, "invalid dtype");
  if (t.shape.size() != t.stride.size())
    Corrupt(path, std::to_string(t.shape.size()) + " sizes but " + std::to_string(t.stride.size()) + " strides");
  if (t.storage_offset < 0) Corrupt(path, "negative storage offset");
  bool empty = false;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] < 0) Corrupt(path, "negative size in dimension " + std::to_string(i));
    if (t.stride[i] < 0) Corrupt(path, "negative stride in dimension " + std::to_string(i));
    empty = empty || t.shape[i] == 0;
  }
  if (ref.view_offset_bytes % element != 0) Corrupt(path, "storage view does not start on an element boundary");
  if (!empty) {
    // Highest element index + 1, in elements from the start of the (view of the) storage.
    unsigned __int128 end = static_cast<uint64_t>(t.storage_offset);
    for (size_t i = 0; i < t.shape.size(); ++i) {
      end += static_cast<unsigned __int128>(t.shape[i] - 1) * static_cast<uint64_t>(t.stride[i]);
      // Each term is below 2^126, so stopping as soon as the sum leaves 64 bits keeps it from
      // wrapping (16 terms of 2^124 add up to 2^128 == 0).
      if (end > UINT64_MAX) Corrupt(path, "extent overflows 64 bits");
    }
    end += 1;
    if (end * element > ref.view_nbytes)
      Corrupt(path, "reaches element " + std::to_string(static_cast<uint64_t>(end - 1)) + " (" +
                        std::to_string(element) + " bytes each) past its storage's " +
                        std::to_string(ref.view_nbytes) + " bytes");
  }
  t.storage_offset += static_cast<int64_t>(ref.view_offset_bytes / element);
  t.storage = ref.index;
}

void ReadFlags(const Value* metadata, TorchTensor& t) {
  t.conj = AsBool(SmallDictGet(metadata, "conj")).value_or(false);
  t.neg = AsBool(SmallDictGet(metadata, "neg")).value_or(false);
}

// Quantizer parameters of _rebuild_qtensor: (qscheme, scale, zero_point) per tensor,
// (qscheme, scales, zero_points, axis) per channel, the latter two being tensors.
void ReadQuantizer(const Value* params, TorchTensor& t, TensorFinding& f, const std::string& path) {
  const std::vector<Value*>* q = Sequence(params);
  if (!q || q->empty() || (*q)[0]->kind != Kind::kGlobal) Corrupt(path, "quantizer parameters are not (qscheme, ...)");
  std::string qscheme((*q)[0]->name);
  JsonObject json;
  json.String("qscheme", qscheme);
  if (qscheme == "per_tensor_affine" || qscheme == "per_tensor_symmetric") {
    auto scale = AsNumber(Arg(*q, 1));
    auto zero_point = AsInt(Arg(*q, 2));
    if (!scale || !zero_point) Corrupt(path, "per-tensor quantizer without a scale and zero point");
    json.Number("scale", *scale).Int("zero_point", *zero_point);
  } else if (qscheme.rfind("per_channel", 0) == 0) {
    auto axis = AsInt(Arg(*q, 3));
    if (!axis || !Arg(*q, 1) || !Arg(*q, 2)) Corrupt(path, "per-channel quantizer without scales, zero points and axis");
    json.Int("axis", *axis);
    f.walk.push_back({(*q)[1], "scales", false});
    f.walk.push_back({(*q)[2], "zero_points", false});
  }
  t.extra = json.str();
}

}  // namespace

std::optional<TensorFinding> TensorInterpreter::Interpret(const Value* obj, const std::string& path) const {
  if (!obj || obj->kind != Kind::kObject) return std::nullopt;
  return Call(obj->callable, obj->args, path, 0);
}

namespace {

enum class Rebuild { kNone, kPlain, kParameter, kFromType };

Rebuild RebuildKind(const Value* fn) {
  if (!IsTorchGlobal(fn)) return Rebuild::kNone;
  std::string_view name = GlobalName(fn);
  if (name == "_rebuild_tensor" || name == "_rebuild_tensor_v2" || name == "_rebuild_tensor_v3" ||
      name == "_rebuild_qtensor")
    return Rebuild::kPlain;
  if (name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state" ||
      (name == "Parameter" && fn->text == "torch.nn.parameter"))
    return Rebuild::kParameter;
  if (name == "_rebuild_from_type_v2" || name == "_rebuild_from_type") return Rebuild::kFromType;
  return Rebuild::kNone;
}

}  // namespace

bool TensorInterpreter::IsRebuildCall(const Value* obj) {
  return obj && obj->kind == Kind::kObject && RebuildKind(obj->callable) != Rebuild::kNone;
}

std::optional<TensorFinding> TensorInterpreter::Call(const Value* fn, const Value* args, const std::string& path,
                                                     int depth) const {
  const Rebuild kind = RebuildKind(fn);
  if (kind == Rebuild::kNone) return std::nullopt;
  std::string_view name = GlobalName(fn);
  if (depth > kMaxRebuildNesting) Corrupt(path, "tensor rebuild calls nested too deep");
  const std::vector<Value*>* a = Sequence(args);
  if (!a) Corrupt(path, std::string(name) + " arguments are not a tuple");
  if (kind == Rebuild::kPlain) return Plain(name, *a, path);
  if (kind == Rebuild::kParameter) return Parameter(name, *a, path, depth);
  return FromType(*a, path, depth);
}

TensorFinding TensorInterpreter::Plain(std::string_view fn, const std::vector<Value*>& a,
                                       const std::string& path) const {
  const bool v3 = fn == "_rebuild_tensor_v3", q = fn == "_rebuild_qtensor", v1 = fn == "_rebuild_tensor";
  const size_t min_args = v1 ? 4 : q ? 7 : v3 ? 7 : 6;
  if (a.size() < min_args) Corrupt(path, std::string(fn) + " with " + std::to_string(a.size()) + " arguments");
  TensorFinding f;
  TorchTensor t;
  t.rebuild = std::string(fn);
  if (!a[0] || a[0]->kind != Kind::kPersistentId) Corrupt(path, "storage argument is not a storage persistent id");
  const StorageRef& ref = storages_.Resolve(a[0]);
  t.dtype = storages_.storages()[ref.index].dtype;
  auto offset = AsInt(a[1]);
  if (!offset) Corrupt(path, "storage offset is not an int");
  t.storage_offset = *offset;
  t.shape = IntList(a[2], path, "size");
  t.stride = IntList(a[3], path, "stride");
  if (v3) {
    const Value* dtype = a[6];
    if (!dtype || dtype->kind != Kind::kGlobal || dtype->text != "torch") Corrupt(path, "dtype is not a torch dtype");
    auto d = DTypeFromName(dtype->name);
    if (!d) throw Error(ErrorKind::kUnsupported, "tensor '" + path + "': dtype torch." + dtype->name + " is not supported");
    t.dtype = *d;
  }
  if (!v1) {
    auto rg = AsBool(a[q ? 5 : 4]);
    if (!rg) Corrupt(path, "requires_grad is not a bool");
    t.requires_grad = *rg;
  }
  if (q) {
    t.quantized = true;
    ReadQuantizer(a[4], t, f, path);
  } else if (!v1) {
    ReadFlags(Arg(a, v3 ? 7 : 6), t);
  }
  PlaceInStorage(t, ref, path);
  f.tensors.push_back({"", std::move(t)});
  return f;
}

TensorFinding TensorInterpreter::Inner(const Value* obj, const std::string& path, int depth) const {
  std::optional<TensorFinding> f;
  if (obj && obj->kind == Kind::kObject) f = Call(obj->callable, obj->args, path, depth + 1);
  if (!f || f->tensors.empty() || f->tensors.front().suffix != "")
    Corrupt(path, "wrapped data is not a tensor rebuild");
  f->consumed.push_back(obj);
  return std::move(*f);
}

TensorFinding TensorInterpreter::Parameter(std::string_view fn, const std::vector<Value*>& a, const std::string& path,
                                           int depth) const {
  if (a.empty()) Corrupt(path, "Parameter without data");
  TensorFinding f = Inner(a[0], path, depth);
  TorchTensor& t = f.tensors.front().tensor;
  t.is_parameter = true;
  // nn.Parameter(data) defaults to requires_grad=True.
  t.requires_grad = a.size() > 1 ? AsBool(a[1]).value_or(true) : true;
  if (fn == "_rebuild_parameter_with_state" && a.size() > 3) f.walk.push_back({a[3], "", true});
  return f;
}

TensorFinding TensorInterpreter::FromType(const std::vector<Value*>& a, const std::string& path, int depth) const {
  // (func, new_type, args, state): the tensor is func(*args), then made a new_type.
  if (a.size() < 3) Corrupt(path, "_rebuild_from_type_v2 with " + std::to_string(a.size()) + " arguments");
  const Value* func = a[0];
  const Value* new_type = a[1];
  const Value* state = Arg(a, 3);
  if (IsTorchGlobal(func) && GlobalName(func) == "_rebuild_wrapper_subclass") {
    if (auto f = Wrapper(a[2], state, path, depth)) return std::move(*f);
    TensorFinding opaque;  // a subclass with no storage of its own: its state may hold tensors
    opaque.walk.push_back({state, "", true});
    return opaque;
  }
  auto inner = Call(func, a[2], path, depth + 1);
  if (!inner || inner->tensors.empty() || inner->tensors.front().suffix != "")
    Corrupt(path, "_rebuild_from_type_v2 does not rebuild a tensor");
  TorchTensor& t = inner->tensors.front().tensor;
  if (IsRebuild(new_type, "Parameter")) {
    t.is_parameter = true;
  } else if (!(new_type && new_type->kind == Kind::kGlobal && new_type->text == "torch" && new_type->name == "Tensor")) {
    t.extra = JsonObject().String("subclass", new_type && new_type->kind == Kind::kGlobal ? ShortGlobalPath(new_type) : "?").str();
  }
  if (state) inner->walk.push_back({state, "", true});
  return std::move(*inner);
}

std::optional<TensorFinding> TensorInterpreter::Wrapper(const Value* wrapper_args, const Value* state,
                                                        const std::string& path, int depth) const {
  const std::vector<Value*>* wa = Sequence(wrapper_args);
  const Value* cls = wa && !wa->empty() ? (*wa)[0] : nullptr;
  if (IsDTensorClass(cls)) {
    auto parts = ReadDTensor(cls, wrapper_args, state);
    if (!parts) return std::nullopt;
    TensorFinding f = Inner(parts->local_tensor, path, depth);
    TorchTensor& t = f.tensors.front().tensor;
    t.dtensor_local = true;
    t.requires_grad = parts->requires_grad;
    t.is_parameter = t.is_parameter || parts->is_param;
    t.extra = parts->extra;
    if (parts->spec) f.walk.push_back({parts->spec, "_spec", false, true});
    return f;
  }
  if (IsShardedTensorClass(cls)) {
    auto parts = ReadShardedTensor(cls, wrapper_args, state);
    if (!parts) return std::nullopt;
    TensorFinding f;
    for (size_t i = 0; i < parts->shards.size(); ++i) {
      std::string suffix = parts->shards.size() == 1 ? "" : "local_shards." + std::to_string(i);
      TensorFinding shard = Inner(parts->shards[i].tensor, suffix.empty() ? path : path + "." + suffix, depth);
      TorchTensor t = std::move(shard.tensors.front().tensor);
      t.sharded_local = true;
      t.requires_grad = parts->requires_grad;
      t.extra = parts->shards[i].extra;
      f.tensors.push_back({suffix, std::move(t)});
      f.consumed.insert(f.consumed.end(), shard.consumed.begin(), shard.consumed.end());
    }
    return f;
  }
  return std::nullopt;
}

}  // namespace zckpt::pickle
