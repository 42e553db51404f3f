#include "pickle/torch_distributed.h"

#include "pickle/json_writer.h"
#include "pickle/torch_values.h"

namespace zckpt::pickle {

namespace {

// Longest lists read per tensor (placements, mesh dimensions, local shards). A DeviceMesh is
// shared by every DTensor through the memo, so without caps a huge one costs its size each time.
constexpr size_t kMaxMeshDims = 64;
constexpr size_t kMaxLocalShards = 4096;

// Wrapper-subclass argument `i`: (cls, dtype, size, stride, offset, layout, device, requires_grad).
const Value* WrapperArg(const Value* args, size_t i) {
  const std::vector<Value*>* a = Sequence(args);
  return a && a->size() > i ? (*a)[i] : nullptr;
}

// An object's attribute from its BUILD state, else its constructor argument `arg` (dataclasses
// pickle either way across releases).
const Value* Field(const Value* obj, std::string_view name, size_t arg) {
  if (!obj) return nullptr;
  if (const Value* v = StateAttribute(obj->state, name)) return v;
  const std::vector<Value*>* a = obj->kind == Kind::kObject ? Sequence(obj->args) : nullptr;
  return a && a->size() > arg ? (*a)[arg] : nullptr;
}

std::string PlacementJson(const Value* p) {
  const Value* g = p && p->kind == Kind::kObject ? ObjectGlobal(p) : p;
  std::string type(GlobalName(g));
  JsonObject json;
  json.String("type", type.empty() ? "?" : type);
  if (type == "Shard" || type == "_StridedShard" || type == "StridedShard") {
    if (auto dim = AsInt(Field(p, "dim", 0))) json.Int("dim", *dim);
    if (type != "Shard")
      if (auto sf = AsInt(Field(p, "split_factor", 1))) json.Int("split_factor", *sf);
  } else if (type.find("Partial") != std::string::npos) {
    if (auto op = AsShortText(Field(p, "reduce_op", 0))) json.String("reduce_op", *op);
  }
  return json.str();
}

// Number of ranks along one mesh dimension described by a _FlatLayout shape: the product of
// its (possibly nested) sizes; () is one rank.
std::optional<int64_t> LayoutSize(const Value* shape, int depth = 0) {
  if (auto i = AsInt(shape)) return *i;
  const std::vector<Value*>* items = Sequence(shape);
  if (!items || depth > 8 || items->size() > kMaxListInts) return std::nullopt;
  int64_t n = 1;
  for (const Value* item : *items) {
    auto s = LayoutSize(item, depth + 1);
    if (!s || __builtin_mul_overflow(n, *s, &n)) return std::nullopt;
  }
  return n;
}

// The mesh shape: from the `mesh` tensor's size (torch <= 2.8) or from the CuTe-style
// `_layout` (one _FlatLayout per dimension, newer releases).
std::optional<std::vector<int64_t>> MeshShape(const Value* mesh) {
  if (const Value* t = StateAttribute(mesh->state, "mesh"); t && t->kind == Kind::kObject) {
    const std::vector<Value*>* a = Sequence(t->args);
    if (a && a->size() >= 3) return AsIntList((*a)[2]);
  }
  const Value* layout = StateAttribute(mesh->state, "_layout");
  const std::vector<Value*>* axes = layout ? Sequence(StateAttribute(layout->state, "axes")) : nullptr;
  if (!axes || axes->size() > kMaxMeshDims) return std::nullopt;
  std::vector<int64_t> shape;
  for (const Value* axis : *axes) {
    auto n = LayoutSize(StateAttribute(axis->state, "shape"));
    if (!n) return std::nullopt;
    shape.push_back(*n);
  }
  return shape;
}

void AddMesh(const Value* mesh, JsonObject& json) {
  if (!mesh || mesh->kind != Kind::kObject) return;
  if (auto shape = MeshShape(mesh)) json.IntList("mesh_shape", *shape);
  const Value* names = StateAttribute(mesh->state, "_mesh_dim_names");
  if (!names) names = StateAttribute(mesh->state, "mesh_dim_names");
  if (const std::vector<Value*>* items = Sequence(names); items && items->size() <= kMaxMeshDims) {
    std::vector<std::string> out;
    for (const Value* n : *items) out.push_back(AsShortText(n).value_or("?"));
    json.Raw("mesh_dim_names", JsonStringList(out));
  }
  const Value* device = StateAttribute(mesh->state, "_device_type");
  if (!device) device = StateAttribute(mesh->state, "device_type");
  if (auto d = AsShortText(device)) json.String("mesh_device_type", *d);
}

// "rank:0/cpu" from a _remote_device (or its string form).
std::optional<std::string> RemoteDevice(const Value* p) {
  if (auto s = AsShortText(p)) return s;
  if (!p || p->kind != Kind::kObject) return std::nullopt;
  auto device = AsDevice(StateAttribute(p->state, "_device"));
  auto worker = AsShortText(StateAttribute(p->state, "_worker_name"));
  auto rank = AsInt(StateAttribute(p->state, "_rank"));
  std::string who = worker ? *worker : rank ? "rank:" + std::to_string(*rank) : "";
  if (who.empty() && !device) return std::nullopt;
  return device ? (who.empty() ? *device : who + "/" + *device) : who;
}

}  // namespace

bool IsDTensorClass(const Value* cls) { return IsTorchGlobal(cls) && GlobalName(cls) == "DTensor"; }
bool IsShardedTensorClass(const Value* cls) { return IsTorchGlobal(cls) && GlobalName(cls) == "ShardedTensor"; }

std::optional<DTensorParts> ReadDTensor(const Value* cls, const Value* wrapper_args, const Value* state) {
  DTensorParts parts;
  parts.local_tensor = StateAttribute(state, "_local_tensor");
  parts.spec = StateAttribute(state, "_spec");
  if (!parts.local_tensor || parts.local_tensor->kind != Kind::kObject) return std::nullopt;
  parts.requires_grad = AsBool(WrapperArg(wrapper_args, 7)).value_or(false);
  parts.is_param = AsBool(StateAttribute(state, "_is_param")).value_or(false);

  JsonObject json;
  const Value* meta = parts.spec ? StateAttribute(parts.spec->state, "tensor_meta") : nullptr;
  auto shape = AsIntList(WrapperArg(wrapper_args, 2));
  if (!shape) shape = AsIntList(Field(meta, "shape", 0));
  auto stride = AsIntList(WrapperArg(wrapper_args, 3));
  if (!stride) stride = AsIntList(Field(meta, "stride", 1));
  if (shape) json.IntList("global_shape", *shape);
  if (stride) json.IntList("global_stride", *stride);
  const std::vector<Value*>* placements =
      parts.spec ? Sequence(StateAttribute(parts.spec->state, "placements")) : nullptr;
  if (placements && placements->size() <= kMaxMeshDims) {
    std::string list = "[";
    for (size_t i = 0; i < placements->size(); ++i) {
      if (i) list += ',';
      list += PlacementJson((*placements)[i]);
    }
    json.Raw("placements", list + "]");
  }
  if (parts.spec) AddMesh(StateAttribute(parts.spec->state, "mesh"), json);
  json.String("class", ShortGlobalPath(cls));
  parts.extra = json.str();
  return parts;
}

std::optional<ShardedTensorParts> ReadShardedTensor(const Value* cls, const Value* wrapper_args, const Value* state) {
  const std::vector<Value*>* fields = Sequence(state);
  if (!fields || fields->empty()) return std::nullopt;
  const std::vector<Value*>* local_shards = Sequence((*fields)[0]);
  if (!local_shards || local_shards->size() > kMaxLocalShards) return std::nullopt;
  const Value* metadata = fields->size() > 1 ? (*fields)[1] : nullptr;
  auto global_shape = AsIntList(Field(metadata, "size", 1));
  if (!global_shape) global_shape = AsIntList(WrapperArg(wrapper_args, 2));

  ShardedTensorParts parts;
  parts.requires_grad = AsBool(WrapperArg(wrapper_args, 7)).value_or(false);
  for (const Value* shard : *local_shards) {
    ShardParts sp;
    sp.tensor = Field(shard, "tensor", 0);
    if (!sp.tensor || sp.tensor->kind != Kind::kObject) return std::nullopt;
    const Value* shard_meta = Field(shard, "metadata", 1);
    JsonObject json;
    if (global_shape) json.IntList("global_shape", *global_shape);
    if (auto offsets = AsIntList(Field(shard_meta, "shard_offsets", 0))) json.IntList("shard_offsets", *offsets);
    if (auto sizes = AsIntList(Field(shard_meta, "shard_sizes", 1))) json.IntList("shard_sizes", *sizes);
    if (auto placement = RemoteDevice(Field(shard_meta, "placement", 2))) json.String("placement", *placement);
    json.String("class", ShortGlobalPath(cls));
    sp.extra = json.str();
    parts.shards.push_back(std::move(sp));
  }
  return parts;
}

}  // namespace zckpt::pickle
