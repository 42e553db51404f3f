// FSDP1's optimizer state as verl saves it: `optimizer.state_dict()` under SHARDED_STATE_DICT,
// whose moments are each rank's shard of a FlatParameter as plain 1-D tensors (`state.<i>.<k>`,
// i the FlatParameter's index in model.parameters()). Nothing in the optimizer files says which
// parameters a FlatParameter holds: that comes from the model files beside them (the
// parameters, in state-dict order, with their global shapes) and FSDP's flattening rules
// (torch/distributed/fsdp/_flat_param.py): a FlatParameter is its FSDP unit's parameters, not
// those of nested units, flattened in order; rank r holds elements [r*S, (r+1)*S) with
// S = ceil(numel / W), zero-padded. Flat optimizer state implies use_orig_params=False (with
// use_orig_params=True the optimizer holds the original parameters), hence no alignment padding.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "merge/verl_files.h"

namespace zckpt::merge {

struct Fsdp1Param {
  std::string fqn;             // as the model's state dict names it (FSDP's clean names)
  std::vector<int64_t> shape;  // global
  int64_t offset = 0;          // first element in its FlatParameter
  int64_t numel = 0;
};

struct Fsdp1FlatParam {
  std::string unit;            // the FSDP unit's module ("" for the root)
  std::vector<Fsdp1Param> params;
  int64_t numel = 0;           // unpadded
  int64_t shard = 0;           // each rank's padded shard at the saved world size
  std::vector<std::string> flat_keys, scalar_keys;  // state entries: 1-D shards ("exp_avg"), 0-d ("step")
};

struct Fsdp1Layout {
  int64_t world = 0;
  std::string wrapped;         // the module list whose every child is an FSDP unit, "" for none
  std::vector<Fsdp1FlatParam> flat_params;  // in optimizer order
};

// The FlatParameter layout of `optim`, a family of FSDP1 flat optimizer state files, or nullopt
// when it is not one (its tensors are not all plain `state.<i>.<k>`, or `dir` has no FSDP1
// model files: ShardedTensors in model_world_size_W_rank_R, or at one rank, where FSDP1 runs
// NO_SHARD and saves plain tensors, floating ones beside 1-D or 0-d optimizer entries only).
// Error(kUnsupported) naming the
// files when it is one but no wrapping of the model's parameters gives its shard sizes, or more
// than one does, or the ranks' shards differ in length (per-parameter shards of
// use_orig_params=True, which these files cannot place).
std::optional<Fsdp1Layout> FindFsdp1Layout(const std::string& dir, const VerlFamily& optim, const MergeOptions& options,
                                           Checkpoint& ck);

// Each parameter's full state, as FSDP's full_optim_state_dict gives it: `state.<fqn>.<k>` of
// the parameter's shape, its pieces the ranks' runs of the flat shards (padding dropped); 0-d
// entries (step) once per parameter, every rank's copy a replica.
void AddFlatOptimPieces(const Fsdp1Layout& layout, const VerlFamily& optim, const MergeOptions& options, Checkpoint& ck);

}  // namespace zckpt::merge
