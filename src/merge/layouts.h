// Finding the full tensors of a sharded checkpoint and the pieces that make them up.
#pragma once

#include <string>

#include "merge/pieces.h"
#include "zckpt/merge.h"

namespace zckpt::merge {

// A DCP folder (`.metadata`, either layout) or verl's per-rank files
// (`<options.files>_world_size_W_rank_R.zckpt|.pt`, every rank 0..W-1 present; a rank's .zckpt
// preferred to its .pt). Error(kInvalidArgument) when `dir` is neither.
Checkpoint Discover(const std::string& dir, const MergeOptions& options);

// A DCP folder's pieces checked to tile every tensor (Tile), no tensor bytes read.
void CheckDcpTilingOf(const std::string& dir);

}  // namespace zckpt::merge
