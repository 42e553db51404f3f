// verl's per-rank files (`<family>_world_size_W_rank_R.zckpt|.pt`) read as tensor records, for
// the merge's layouts (layouts.cc) and FSDP1's flat optimizer state (fsdp1_flat.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "merge/pieces.h"
#include "zckpt/merge.h"

namespace zckpt::merge {

// One tensor record of a verl file, from a container or a .pt.
struct Record {
  std::string name;
  uint32_t flags = 0;
  std::string extra;  // placement metadata JSON (DTensor / ShardedTensor local shards)
  SavedView view;
};

struct VerlFamily {
  std::string family;
  int64_t world = 0;
  std::vector<std::string> paths;          // by rank
  std::vector<std::vector<Record>> ranks;  // by rank, in each file's order
};

// True when `dir` holds at least one file of `family`.
bool HasVerlFamily(const std::string& dir, const std::string& family);

// Every rank file of `family` (ranks 0..W-1 all present, a rank's .zckpt preferred to its .pt),
// its pickle vetted and checked against the index, its saved-as name and DTensor mesh checked;
// the files stay open in `ck`. Error(kInvalidArgument) when there are none or ranks are missing.
VerlFamily ReadVerlFamily(const std::string& dir, const std::string& family, const MergeOptions& options,
                          Checkpoint& ck);

// A ShardedTensor local shard's global shape, from its record's placement metadata.
std::vector<int64_t> ShardedGlobalShape(const Record& r);

// "w.local_shards.0" -> "w" (a ShardedTensor's record names its local shard).
std::string ShardedTensorName(const std::string& record_name);

}  // namespace zckpt::merge
