// LoadRegions: boxes and element runs of tensor records into existing tensors
// (include/zckpt/load_regions.h).
#include "zckpt/load_regions.h"

#include <chrono>
#include <optional>
#include <string>

#include "loader/copy_views.h"
#include "loader/stream.h"
#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt {

namespace {

std::string Dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The record `t` narrowed to the box, or why it cannot be. Bounds are checked without overflow:
// the record's own extent was validated at open, and the box lies inside its shape.
std::optional<TensorInfo> Narrow(const TensorInfo& t, const Region& r, std::string* why) {
  const std::string name = "'" + r.tensor + "'";
  if (r.offsets.size() != t.shape.size() || r.lengths.size() != t.shape.size()) {
    *why = name + " has " + std::to_string(t.shape.size()) + " dimensions, the box offsets " + Dims(r.offsets) +
           " lengths " + Dims(r.lengths);
    return std::nullopt;
  }
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (r.offsets[i] < 0 || r.lengths[i] < 0 || r.offsets[i] > t.shape[i] || r.lengths[i] > t.shape[i] - r.offsets[i]) {
      *why = "box offsets " + Dims(r.offsets) + " lengths " + Dims(r.lengths) + " is outside " + name + " of shape " +
             Dims(t.shape);
      return std::nullopt;
    }
  }
  TensorInfo v = t;
  v.shape = r.lengths;
  uint64_t numel = 1;
  int64_t last = 0;  // element offset of the box's last element from its first
  for (size_t i = 0; i < v.shape.size(); ++i) {
    numel *= static_cast<uint64_t>(v.shape[i]);
    v.storage_offset += static_cast<uint64_t>(r.offsets[i] * t.stride[i]);
    if (v.shape[i] > 0) last += (v.shape[i] - 1) * t.stride[i];
  }
  uint64_t item = DTypeSize(t.dtype);
  if (numel == 0) {
    v.byte_begin = v.byte_end = 0;
  } else {
    v.byte_begin = v.storage_offset * item;
    v.byte_end = (v.storage_offset + static_cast<uint64_t>(last) + 1) * item;
  }
  return v;
}

// The record `t` narrowed to the element run, or why it cannot be: a 1-D view of its storage
// going to the target's flat alias, streamed chunk by chunk straight into the target.
std::optional<TensorInfo> Run(const TensorInfo& t, const Region& r, std::string* why) {
  const std::string& name = r.tensor;
  *why = loader::DTypeProblem(t, name, r.target);
  if (why->empty() && !loader::SavedContiguous(t))
    *why = "'" + name + "' is not contiguous in its storage: element ranges need a contiguous saved tensor";
  if (why->empty() && !r.target.is_contiguous()) *why = "the target of '" + name + "' is not contiguous";
  const uint64_t item = DTypeSize(t.dtype);
  const uint64_t numel = t.byte_end > t.byte_begin ? (t.byte_end - t.byte_begin) / item : 0;
  const auto count = static_cast<uint64_t>(r.target.numel());
  if (why->empty() && (r.begin > numel || count > numel - r.begin))
    *why = "elements [" + std::to_string(r.begin) + ", " + std::to_string(r.begin + count) + ") of '" + name +
           "' are past its " + std::to_string(numel) + " elements";
  if (!why->empty()) return std::nullopt;
  TensorInfo v = t;
  v.shape = {static_cast<int64_t>(count)};
  v.stride = {1};
  v.storage_offset = t.storage_offset + r.begin;
  v.byte_begin = t.byte_begin + r.begin * item;
  v.byte_end = count ? v.byte_begin + count * item : v.byte_begin;
  return v;
}

std::string TargetProblem(const Region& r) {
  if (std::string why = loader::TargetProblem(r.tensor, r.target); !why.empty()) return why;
  if (r.elements) return "";
  if (c10::IntArrayRef(r.lengths) != r.target.sizes())
    return "target '" + r.tensor + "' has shape " + Dims(r.target.sizes().vec()) + ", the box has lengths " + Dims(r.lengths);
  return "";
}

}  // namespace

LoadRegionsReport LoadRegions(const std::string& path, const std::vector<Region>& regions, const LoadOptions& options) {
  return LoadRegions(*Container::Open(path), regions, options);
}

LoadRegionsReport LoadRegions(const Container& container, const std::vector<Region>& regions,
                              const LoadOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  const Container* c = &container;
  const std::string& path = c->path();
  loader::ResolveContainerLoad(options, *c);
  (void)loader::VetObjectPickle(*c, options.allow_globals);  // as LoadInto: none in DCP's own containers
  std::vector<loader::ViewCopy> copies;
  std::vector<std::string> problems;
  for (const Region& r : regions) {
    std::optional<uint32_t> i = c->FindTensor(r.tensor);
    if (!i) {
      problems.push_back("'" + r.tensor + "' is not in the file");
      continue;
    }
    TensorInfo t = c->tensor(*i);
    std::string why = TargetProblem(r);
    std::optional<TensorInfo> v;
    if (why.empty()) v = r.elements ? Run(t, r, &why) : Narrow(t, r, &why);
    if (!why.empty()) {
      problems.push_back(why);
      continue;
    }
    try {
      loader::CheckViewable(*c, *v);
    } catch (const Error& e) {
      problems.push_back(e.what());
      continue;
    }
    copies.push_back(loader::ViewCopy{r.elements ? r.target.view({-1}) : r.target, std::move(*v)});
  }
  if (!problems.empty()) {
    std::string msg = "cannot load regions of " + path + ":";
    for (const auto& p : problems) msg += "\n  " + p;
    throw Error(ErrorKind::kInvalidArgument, msg);
  }
  loader::ViewCopyReport r = loader::CopyViews(*c, std::move(copies), options, t0);
  return LoadRegionsReport{r.copies, r.direct, r.staged, r.stats};
}

}  // namespace zckpt
