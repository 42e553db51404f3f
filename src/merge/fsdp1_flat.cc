// FSDP1 flat optimizer state -> each parameter's full moments (fsdp1_flat.h).
#include "merge/fsdp1_flat.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <cctype>
#include <regex>
#include <set>

#include "zckpt/error.h"
#include "zckpt/format.h"
#include "zckpt/merge.h"

namespace zckpt::merge {

namespace {

bool Digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

std::vector<std::string> Split(const std::string& fqn) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t dot; (dot = fqn.find('.', at)) != std::string::npos; at = dot + 1) out.push_back(fqn.substr(at, dot - at));
  out.push_back(fqn.substr(at));
  return out;
}

// A flat state file's entries: index -> key -> record, one map per rank.
using FlatStates = std::map<int64_t, std::map<std::string, const Record*>>;

// nullopt when some tensor of the file is not a plain `state.<i>.<k>`.
std::optional<FlatStates> FlatStatesOf(const std::vector<Record>& records) {
  static const std::regex entry("^state\\.([0-9]{1,9})\\.(.+)$");
  FlatStates out;
  for (const Record& r : records) {
    if (r.flags & format::kTensorInternal) continue;
    std::smatch m;
    if ((r.flags & (format::kTensorDTensorLocal | format::kTensorShardedLocal)) || !std::regex_match(r.name, m, entry))
      return std::nullopt;
    out[std::stoll(m[1])][m[2]] = &r;
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// Whether a tensor of this dtype can be a trained parameter (floating or complex): integer and
// bool tensors in a model file are buffers.
bool CanBeParameter(DType d) {
  switch (d) {
    case DType::kFloat16: case DType::kBFloat16: case DType::kFloat32: case DType::kFloat64:
    case DType::kComplex32: case DType::kComplex64: case DType::kComplex128:
    case DType::kFloat8_e4m3fn: case DType::kFloat8_e5m2: case DType::kFloat8_e4m3fnuz: case DType::kFloat8_e5m2fnuz:
      return true;
    default:
      return false;
  }
}

// The model's parameters in state-dict order. Above one rank they are the ShardedTensors of
// rank 0's model file (plain tensors there are buffers: FSDP1's SHARDED_STATE_DICT shards every
// parameter). At one rank FSDP1 runs NO_SHARD, whose SHARDED_STATE_DICT is the full state dict
// of plain tensors: every floating one is taken as a parameter. A floating buffer taken so
// makes its unit's size differ from every FlatParameter's, so no wrapping matches and the
// layout is refused, never misplaced.
std::vector<Fsdp1Param> ModelParams(const VerlFamily& model) {
  std::vector<Fsdp1Param> out;
  std::set<std::string> seen;
  const bool no_shard = model.world == 1 && std::none_of(model.ranks[0].begin(), model.ranks[0].end(), [](const Record& r) {
    return (r.flags & format::kTensorShardedLocal) != 0;
  });
  for (const Record& r : model.ranks[0]) {
    if (r.flags & format::kTensorInternal) continue;
    std::string fqn;
    std::vector<int64_t> shape;
    if (no_shard) {
      if (r.flags & format::kTensorDTensorLocal) return {};  // FSDP2's DTensors: no FlatParameters
      if (!CanBeParameter(r.view.dtype)) continue;
      fqn = r.name;
      shape = r.view.shape;
    } else {
      if (!(r.flags & format::kTensorShardedLocal)) continue;
      fqn = ShardedTensorName(r.name);
      shape = ShardedGlobalShape(r);
    }
    if (!seen.insert(fqn).second) continue;
    Fsdp1Param p{fqn, std::move(shape), 0, 1};
    for (int64_t d : p.shape) p.numel *= d;
    out.push_back(std::move(p));
  }
  return out;
}

// Whether every entry of the files is 0-d or 1-D, as FlatParameter state is. At one rank,
// use_orig_params=True keeps each original parameter's state in its own shape: nothing was
// flattened, so there is no layout to undo.
bool AllFlatOrScalar(const std::vector<FlatStates>& states) {
  for (const FlatStates& s : states)
    for (const auto& [index, entries] : s)
      for (const auto& [key, rec] : entries)
        if (rec->view.shape.size() > 1) return false;
  return true;
}

// The FSDP units of one wrapping: the root, plus every child `<list>.<k>` of the module list
// `list` ("" for none). Parameters in state-dict order; the root's FlatParameter comes first in
// model.parameters() (it is registered on the root module itself), then the units in module order.
std::vector<Fsdp1FlatParam> Units(const std::vector<Fsdp1Param>& params, const std::string& list, int64_t world) {
  std::vector<Fsdp1FlatParam> units(1);
  std::map<std::string, size_t> at;
  for (const Fsdp1Param& p : params) {
    size_t u = 0;
    if (!list.empty() && p.fqn.rfind(list + ".", 0) == 0) {
      std::vector<std::string> rest = Split(p.fqn.substr(list.size() + 1));
      if (rest.size() > 1 && Digits(rest[0])) {
        std::string unit = list + "." + rest[0];
        auto [it, fresh] = at.emplace(unit, units.size());
        if (fresh) units.push_back(Fsdp1FlatParam{unit, {}, 0, 0, {}, {}});
        u = it->second;
      }
    }
    Fsdp1FlatParam& f = units[u];
    f.params.push_back(p);
    f.params.back().offset = f.numel;
    f.numel += p.numel;
  }
  if (units[0].params.empty()) units.erase(units.begin());  // a root without parameters of its own
  for (Fsdp1FlatParam& f : units) f.shard = (f.numel + world - 1) / world;
  return units;
}

}  // namespace

std::optional<Fsdp1Layout> FindFsdp1Layout(const std::string& dir, const VerlFamily& optim, const MergeOptions& options,
                                           Checkpoint& ck) {
  if (optim.family == "model") return std::nullopt;
  std::vector<FlatStates> states;
  for (const std::vector<Record>& records : optim.ranks) {
    std::optional<FlatStates> s = FlatStatesOf(records);
    if (!s) return std::nullopt;
    states.push_back(std::move(*s));
  }
  if (!HasVerlFamily(dir, "model")) return std::nullopt;
  VerlFamily model = ReadVerlFamily(dir, "model", options, ck);
  std::vector<Fsdp1Param> params = ModelParams(model);
  if (params.empty()) return std::nullopt;  // no ShardedTensors above one rank: not FSDP1
  if (optim.world == 1 && !AllFlatOrScalar(states)) return std::nullopt;
  const std::string& opath = optim.paths[0];
  const std::string& mpath = model.paths[0];
  if (model.world != optim.world)
    throw Error(ErrorKind::kInvalidArgument, dir + ": model files of " + std::to_string(model.world) +
                                                 " ranks beside optimizer files of " + std::to_string(optim.world));

  // Each FlatParameter's shard length and entries, the same on every rank.
  const FlatStates& first = states[0];
  std::vector<int64_t> shards;
  std::vector<std::vector<std::string>> flat_keys, scalar_keys;
  int64_t expect = 0;
  for (const auto& [index, entries] : first) {
    if (index != expect++)
      throw Error(ErrorKind::kUnsupported, opath + ": optimizer state for parameter " + std::to_string(index) +
                                               " but none for " + std::to_string(expect - 1) +
                                               ": not one state per FlatParameter (FSDP1 with use_orig_params=True keeps "
                                               "per-parameter shards, none where a rank holds no elements; or a frozen "
                                               "FlatParameter): these files cannot place its shards; refusing");
    int64_t shard = -1;
    flat_keys.emplace_back();
    scalar_keys.emplace_back();
    for (const auto& [key, rec] : entries) {
      const SavedView& v = rec->view;
      if (v.shape.empty()) {
        scalar_keys.back().push_back(key);
        continue;
      }
      if (v.shape.size() != 1 || (shard >= 0 && v.shape[0] != shard))
        throw Error(ErrorKind::kUnsupported, v.what + ": shape " + Dims(v.shape) + " is not a FlatParameter shard (1-D, " +
                                                 "the length of the parameter's other entries)");
      shard = v.shape[0];
      flat_keys.back().push_back(key);
    }
    shards.push_back(std::max<int64_t>(shard, 0));
  }
  for (size_t r = 1; r < states.size(); ++r) {
    for (const auto& [index, entries] : states[r]) {
      auto f = first.find(index);
      for (const auto& [key, rec] : entries) {
        const Record* a = f == first.end() || !f->second.count(key) ? nullptr : f->second.at(key);
        // FlatParameter shards have one length on every rank; per-parameter shards of varying
        // length are FSDP1 with use_orig_params=True (or no FSDP1 at all): not placed, refused.
        if (!a || a->view.shape != rec->view.shape)
          throw Error(ErrorKind::kUnsupported,
                      rec->view.what + ": shape " + Dims(rec->view.shape) + ", but " +
                          (a ? a->view.what + " has " + Dims(a->view.shape) : opath + " has no such entry") +
                          ": not FSDP1 FlatParameter shards (one length on every rank); per-parameter shards "
                          "(use_orig_params=True) cannot be placed from these files; refusing");
      }
      if (f == first.end() || f->second.size() != entries.size())
        throw Error(ErrorKind::kUnsupported, optim.paths[r] + ": optimizer state for parameter " + std::to_string(index) +
                                             " has other entries than in " + opath);
    }
    if (states[r].size() != first.size())
      throw Error(ErrorKind::kUnsupported, optim.paths[r] + ": state for " + std::to_string(states[r].size()) +
                                           " parameters, " + opath + " for " + std::to_string(first.size()));
  }

  // The wrappings to try: the root alone, and the root plus every child of one module list.
  std::set<std::string> lists{""};
  for (const Fsdp1Param& p : params) {
    std::vector<std::string> c = Split(p.fqn);
    std::string prefix;
    for (size_t j = 0; j + 1 < c.size(); ++j) {
      if (j > 0 && Digits(c[j])) lists.insert(prefix);
      prefix += (j ? "." : "") + c[j];
    }
  }
  std::vector<Fsdp1Layout> matches;
  for (const std::string& list : lists) {
    std::vector<Fsdp1FlatParam> units = Units(params, list, optim.world);
    if (units.size() != shards.size()) continue;
    bool ok = true;
    for (size_t i = 0; ok && i < units.size(); ++i) ok = units[i].shard == shards[i];
    if (ok) matches.push_back(Fsdp1Layout{optim.world, list, std::move(units)});
  }
  auto unit_names = [](const Fsdp1Layout& l) {
    std::vector<std::string> names;
    for (const Fsdp1FlatParam& f : l.flat_params)
      for (const Fsdp1Param& p : f.params) names.push_back(f.unit + "|" + p.fqn);
    return names;
  };
  for (size_t i = 1; i < matches.size(); ++i)
    if (unit_names(matches[i]) != unit_names(matches[0]))
      throw Error(ErrorKind::kUnsupported,
                  opath + ": its FlatParameter shard sizes " + Dims(shards) + " fit more than one FSDP1 wrapping of " + mpath +
                      "'s parameters (" + (matches[0].wrapped.empty() ? "the root alone" : "every " + matches[0].wrapped + ".N") +
                      ", " + (matches[i].wrapped.empty() ? "the root alone" : "every " + matches[i].wrapped + ".N") +
                      "): cannot tell which parameter's moments lie where; refusing");
  if (matches.empty())
    throw Error(ErrorKind::kUnsupported,
                opath + ": FSDP1 flat optimizer state of " + std::to_string(shards.size()) + " FlatParameters with shards of " +
                    Dims(shards) + " elements, but no FSDP1 wrapping of " + mpath + "'s " + std::to_string(params.size()) +
                    " parameters (the root module alone, or the root plus every child of one module list such as "
                    "model.layers) gives those sizes" +
                    (optim.world == 1 ? std::string(" (at one rank FSDP1 saves plain tensors, each floating one taken as a "
                                                    "parameter: a floating buffer there also prevents a match)")
                                      : std::string()) +
                    ": the files do not say where each parameter's moments lie; refusing "
                    "(save the optimizer with FSDP.optim_state_dict, or merge through DCP)");
  Fsdp1Layout layout = std::move(matches[0]);
  for (size_t i = 0; i < layout.flat_params.size(); ++i) {
    layout.flat_params[i].flat_keys = flat_keys[i];
    layout.flat_params[i].scalar_keys = scalar_keys[i];
  }
  return layout;
}

void AddFlatOptimPieces(const Fsdp1Layout& layout, const VerlFamily& optim, const MergeOptions& options, Checkpoint& ck) {
  static const std::regex entry("^state\\.([0-9]{1,9})\\.(.+)$");
  // rank -> (index, key) -> record
  std::vector<std::map<std::pair<int64_t, std::string>, const Record*>> at(optim.world);
  for (int64_t r = 0; r < optim.world; ++r)
    for (const Record& rec : optim.ranks[r]) {
      std::smatch m;
      if (std::regex_match(rec.name, m, entry)) at[r][{std::stoll(m[1]), m[2]}] = &rec;
    }
  for (size_t i = 0; i < layout.flat_params.size(); ++i) {
    const Fsdp1FlatParam& f = layout.flat_params[i];
    const int64_t index = static_cast<int64_t>(i);
    for (const Fsdp1Param& p : f.params) {
      for (const std::string& key : f.scalar_keys) {
        std::string name = "state." + p.fqn + "." + key;
        if (!SelectName(options.keys, &name)) continue;
        FullTensor t{name, at[0].at({index, key})->view.dtype, {}, {}, {}};
        for (int64_t r = 0; r < optim.world; ++r) t.pieces.push_back(Piece{at[r].at({index, key})->view, {}, {}});
        ck.tensors.push_back(std::move(t));
      }
      for (const std::string& key : f.flat_keys) {
        std::string name = "state." + p.fqn + "." + key;
        if (!SelectName(options.keys, &name)) continue;
        FullTensor t{name, at[0].at({index, key})->view.dtype, p.shape, {}, {p.numel}};
        for (int64_t r = 0; r < optim.world; ++r) {
          // Rank r holds flat elements [r*S, r*S + S); this parameter is [offset, offset + numel).
          const int64_t lo = std::max(p.offset, r * f.shard), hi = std::min(p.offset + p.numel, (r + 1) * f.shard);
          if (lo >= hi) continue;
          SavedView v = at[r].at({index, key})->view;
          const int64_t stride = v.stride.empty() ? 1 : v.stride[0];
          v.storage_offset += static_cast<uint64_t>((lo - r * f.shard) * stride);
          v.shape = {hi - lo};
          v.stride = {stride};
          v.what += " elements [" + std::to_string(lo - r * f.shard) + ", " + std::to_string(hi - r * f.shard) + ") ('" +
                    p.fqn + "')";
          t.pieces.push_back(Piece{std::move(v), {lo - p.offset}, {}});
        }
        ck.tensors.push_back(std::move(t));
      }
    }
  }
}

}  // namespace zckpt::merge

namespace zckpt {

std::string Fsdp1OptimLayout(const std::string& dir, const MergeOptions& options) {
  merge::Checkpoint ck;
  merge::VerlFamily optim = merge::ReadVerlFamily(dir, options.files, options, ck);
  std::optional<merge::Fsdp1Layout> layout = merge::FindFsdp1Layout(dir, optim, options, ck);
  if (!layout) return "";
  nlohmann::json flats = nlohmann::json::array();
  for (const merge::Fsdp1FlatParam& f : layout->flat_params) {
    nlohmann::json params = nlohmann::json::array();
    for (const merge::Fsdp1Param& p : f.params)
      params.push_back({{"fqn", p.fqn}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel}});
    flats.push_back({{"unit", f.unit}, {"numel", f.numel}, {"shard", f.shard}, {"flat_keys", f.flat_keys},
                     {"scalar_keys", f.scalar_keys}, {"params", params}});
  }
  nlohmann::json out = {{"world_size", layout->world}, {"wrapped", layout->wrapped}, {"flat_params", flats}};
  return out.dump();
}

}  // namespace zckpt
