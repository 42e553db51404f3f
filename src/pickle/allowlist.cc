#include "pickle/allowlist.h"

#include <cctype>
#include <string>

#include "zckpt/dtype.h"

namespace zckpt::pickle {

namespace {

// clang-format off
// Exact paths. The families (dtypes, storage and tensor classes, nn modules) are below.
constexpr std::string_view kDataGlobals[] = {
  // --- Python data: constructors of plain values and the helpers pickle itself uses --------
  "builtins.set", "builtins.frozenset", "builtins.bytes", "builtins.bytearray", "builtins.complex",
  "builtins.slice", "builtins.range", "builtins.int", "builtins.float", "builtins.str", "builtins.bool",
  "builtins.list", "builtins.dict", "builtins.tuple", "builtins.object",
  "builtins.Ellipsis", "builtins.NotImplemented",
  "_codecs.encode",             // how protocol 2 pickles bytes: encode(text, 'latin1')
  "copyreg._reconstructor",     // protocol 0/1 objects: cls.__new__ + __init__ of a vetted class
  "collections.OrderedDict", "collections.Counter", "collections.defaultdict", "collections.deque",
  "datetime.datetime", "datetime.date", "datetime.time", "datetime.timedelta", "datetime.timezone",
  "types.SimpleNamespace", "argparse.Namespace",
  // --- numpy: arrays, scalars, dtypes, RandomState (RNG states in extra_state files) -------
  "numpy.ndarray", "numpy.dtype",
  "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
  "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
  "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer",
  "numpy.random._pickle.__randomstate_ctor", "numpy.random._pickle.__generator_ctor",
  "numpy.random._pickle.__bit_generator_ctor",
  // --- torch: tensors, storages, shapes, devices, layouts, quantization schemes ------------
  "torch.Size", "torch.Tensor", "torch.device",
  "torch.storage.TypedStorage", "torch.storage.UntypedStorage", "torch.UntypedStorage", "torch.TypedStorage",
  "torch.serialization._get_layout",
  "torch.nn.parameter.Parameter",
  "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
  "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
  "torch._utils._rebuild_qtensor", "torch._utils._rebuild_sparse_tensor",
  "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_nested_tensor",
  "torch._utils._rebuild_wrapper_subclass", "torch._utils._rebuild_device_tensor_from_cpu_tensor",
  "torch._utils._rebuild_device_tensor_from_numpy",
  "torch._tensor._rebuild_from_type", "torch._tensor._rebuild_from_type_v2",
  "torch.per_tensor_affine", "torch.per_tensor_symmetric", "torch.per_channel_affine",
  "torch.per_channel_symmetric", "torch.per_channel_affine_float_qparams",
  "torch.strided", "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr",
  "torch.sparse_bsc", "torch.jagged",
  "torch.contiguous_format", "torch.channels_last", "torch.channels_last_3d", "torch.preserve_format",
  // --- DTensor (FSDP2 state dicts): torch.distributed registers these as safe globals -------
  "torch.distributed.tensor.DTensor", "torch.distributed.tensor._api.DTensor", "torch.distributed._tensor.api.DTensor",
  "torch.distributed.tensor._dtensor_spec.DTensorSpec", "torch.distributed.tensor._dtensor_spec.TensorMeta",
  "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
  "torch.distributed._tensor.placement_types.DTensorSpec", "torch.distributed._tensor.placement_types.TensorMeta",
  "torch.distributed.tensor.placement_types.Shard", "torch.distributed.tensor.placement_types.Replicate",
  "torch.distributed.tensor.placement_types.Partial", "torch.distributed.tensor.placement_types._StridedShard",
  "torch.distributed._tensor.placement_types.Shard", "torch.distributed._tensor.placement_types.Replicate",
  "torch.distributed._tensor.placement_types._Partial", "torch.distributed._tensor.placement_types.Partial",
  "torch.distributed.device_mesh.DeviceMesh", "torch.distributed._mesh_layout._FlatLayout",
  "torch.distributed._mesh_layout._MeshLayout",
  // --- ShardedTensor (FSDP's older sharded state dicts) -------------------------------------
  "torch.distributed._shard.sharded_tensor.api.ShardedTensor",
  "torch.distributed._shard.sharded_tensor.api.ShardedTensor.ProcessGroupState",
  "torch.distributed._shard.sharded_tensor.metadata.ShardedTensorMetadata",
  "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
  "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
  "torch.distributed._shard.sharded_tensor.shard.Shard",
  "torch.distributed._shard.metadata.ShardMetadata",
  "torch.distributed._shard.sharding_spec.api.EnumerableShardingSpec",
  "torch.distributed._shard.sharding_spec.chunk_sharding_spec.ChunkShardingSpec",
  "torch.distributed.remote_device._remote_device",
};
// clang-format on

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// What follows `prefix` in `path`, when `path` starts with it.
bool After(std::string_view path, std::string_view prefix, std::string_view* rest) {
  if (!StartsWith(path, prefix)) return false;
  *rest = path.substr(prefix.size());
  return true;
}

bool IsIdentifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// torch.float32, torch.bfloat16, torch.uint4, ...: the dtypes zckpt's table knows.
bool IsTorchDType(std::string_view path) {
  std::string_view name;
  return After(path, "torch.", &name) && DTypeFromName(name).has_value();
}

// The legacy typed classes: torch[.cuda].<T>Storage and torch[.cuda][.sparse].<T>Tensor, <T>
// one of the storage prefixes of the dtype table (Float, Half, QInt8, ...).
bool IsTorchStorageOrTensorClass(std::string_view path) {
  std::string_view name;
  if (!(After(path, "torch.cuda.sparse.", &name) || After(path, "torch.cuda.", &name) ||
        After(path, "torch.sparse.", &name) || After(path, "torch.", &name)))
    return false;
  if (name.find('.') != std::string_view::npos) return false;
  constexpr std::string_view kTensor = "Tensor";
  if (name.size() > kTensor.size() && name.substr(name.size() - kTensor.size()) == kTensor) {
    std::string storage(name.substr(0, name.size() - kTensor.size()));
    return DTypeFromStorageName(storage + "Storage").has_value();
  }
  bool sparse = StartsWith(path, "torch.sparse.") || StartsWith(path, "torch.cuda.sparse.");
  return !sparse && DTypeFromStorageName(name).has_value();
}

// A whole nn.Module saved with torch.save(module): torch.nn.modules.<file>.<Class>. Classes
// only (capitalised), never the functions next to them (hook registration).
bool IsTorchModuleClass(std::string_view path) {
  std::string_view rest;
  if (!After(path, "torch.nn.modules.", &rest)) return false;
  size_t dot = rest.find('.');
  if (dot == std::string_view::npos || !IsIdentifier(rest.substr(0, dot))) return false;
  std::string_view cls = rest.substr(dot + 1);
  return IsIdentifier(cls) && std::isupper(static_cast<unsigned char>(cls[0]));
}

}  // namespace

bool IsDataGlobal(std::string_view path) {
  for (std::string_view g : kDataGlobals)
    if (path == g) return true;
  return IsTorchDType(path) || IsTorchStorageOrTensorClass(path) || IsTorchModuleClass(path);
}

}  // namespace zckpt::pickle
