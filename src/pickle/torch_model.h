// What a torch.save pickle (`data.pkl`, or a legacy file's object pickle) describes, read off
// the object tree without running anything: the storages its persistent ids name, the tensors
// its rebuild calls describe (named by where they sit in the tree), numpy values, and the
// globals it uses that are not torch's own.
//
// Tensor names are paths: dict keys and list/tuple indices joined with '.', e.g.
// `layers.0.attn.weight`, `state.3.exp_avg`. An object's args, kwargs, APPENDed items,
// SETITEMs and BUILD state appear at the object's own path (a module state_dict's entries
// stay `weight`, not `weight.args`). A tensor reached twice (memo) gets one record per path
// (tied weights are found under both names), the same view of the same storage, in depth-first
// order; a name already taken gets `~1`, `~2`, ... appended; a tensor that is the whole pickle
// is named `tensor`. Dict keys are not searched for tensors. Names are at most 64 KiB, and all
// records together at most 256 MiB (kCorrupt beyond: only a hostile pickle gets there).
// Per-channel quantizer tensors are `<name>.scales` / `<name>.zero_points`; the DeviceMesh of a
// DTensor is walked under `<name>._spec`; several local shards of one ShardedTensor are
// `<name>.local_shards.<i>`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pickle/unpickler.h"
#include "zckpt/dtype.h"

namespace zckpt::pickle {

struct TorchStorage {
  std::string key;           // opaque: record `data/<key>` (zip) or the legacy data-section key
  std::string storage_type;  // the storage class as written: "torch.FloatStorage", "torch.storage.UntypedStorage"
  DType dtype = DType::kInvalid;  // element type; kUInt8 when untyped
  bool untyped = false;      // UntypedStorage: numel counts bytes
  std::string location;      // "cpu", "cuda:0", ...: recorded, never acted on
  uint64_t numel = 0;        // elements of `dtype`
  uint64_t nbytes = 0;       // numel * element size
};

struct TorchTensor {
  std::string name;
  size_t storage = 0;            // index into TorchPickle::storages
  DType dtype = DType::kInvalid;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;   // elements
  int64_t storage_offset = 0;    // elements of `dtype` (legacy storage views already folded in)
  bool requires_grad = false;
  bool is_parameter = false;     // nn.Parameter (also a DTensor saved as one)
  bool conj = false;             // conjugate bit (metadata {'conj': True})
  bool neg = false;              // negative bit (metadata {'neg': True})
  bool quantized = false;        // _rebuild_qtensor; quantizer in `extra`
  bool dtensor_local = false;    // the local tensor of a DTensor; global view in `extra`
  bool sharded_local = false;    // a local shard of a ShardedTensor; shard metadata in `extra`
  bool internal = false;         // inside another tensor's metadata (a DTensor's DeviceMesh)
  std::string rebuild;           // the rebuild function: "_rebuild_tensor_v2", ...
  uint64_t pickle_offset = 0;    // offset of the opcode that built the tensor's node (at `name`)
  // Compact JSON, "" when nothing to add:
  //   quantized: {"qscheme":"per_tensor_affine","scale":0.1,"zero_point":3} or
  //              {"qscheme":"per_channel_affine","axis":0}
  //   dtensor:   {"global_shape":[..],"global_stride":[..],"placements":[{"type":"Shard","dim":0},
  //               {"type":"Replicate"},{"type":"Partial","reduce_op":"sum"},
  //               {"type":"_StridedShard","dim":0,"split_factor":2}],"mesh_shape":[..],
  //               "mesh_dim_names":[..],"class":"torch.distributed.tensor.DTensor"}
  //   sharded:   {"global_shape":[..],"shard_offsets":[..],"shard_sizes":[..],"placement":"rank:0/cpu",
  //               "class":"..."}
  //   other tensor subclasses: {"subclass":"module.Name"}
  std::string extra;
};

struct NumpyValue {
  std::string path;             // same naming as tensors
  std::string dtype;            // numpy's dtype.str: "<u4", "|b1", ...
  std::vector<int64_t> shape;   // empty for a scalar
  bool scalar = false;          // numpy scalar (np.float32(1.0)) rather than an ndarray
};

struct OpaqueGlobal {
  std::string name;   // "module.name"
  uint64_t count = 0; // objects built by it (or bare references to it) in the tree
};

struct TorchPickle {
  std::vector<TorchStorage> storages;  // in order of first appearance in the pickle
  std::vector<TorchTensor> tensors;    // depth-first order of the tree
  std::vector<NumpyValue> numpy;
  std::vector<OpaqueGlobal> opaque_globals;  // globals outside torch, in order of first use
};

// Interprets the tree of a torch.save pickle. Errors: kCorrupt for malformed storages or
// tensors (conflicting claims on one storage key, a tensor reaching past its storage, bad
// shapes), naming the tensor; kUnsupported for a dtype or storage class this build does not
// know.
TorchPickle InterpretTorchPickle(const UnpickleResult& pickle);

// Render() of the tree with each tensor shown as `<tensor 'name' float32[2, 3]>` (plus
// ` param`, ` dtensor`, ` shard`, ` quantized` when set) and each storage persistent id as
// `<storage 'key'>`: the one-line view a listing wants.
std::string RenderTorch(const UnpickleResult& pickle, const TorchPickle& model, size_t max_chars = size_t{1} << 24);

}  // namespace zckpt::pickle
