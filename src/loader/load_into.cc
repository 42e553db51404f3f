// LoadInto: the file's tensors copied in place into existing tensors, matched by name.
#include <algorithm>
#include <chrono>
#include <optional>
#include <sstream>

#include "loader/copy_views.h"
#include "loader/plan.h"
#include "loader/stream.h"
#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/format.h"
#include "zckpt/loader.h"

namespace zckpt {

namespace {

using Targets = std::vector<std::pair<std::string, at::Tensor>>;

std::string Shape(c10::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

std::string Quoted(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

// Why the file's dtype `t.dtype` cannot go into `target`'s, or "".
std::string DTypeProblem(const TensorInfo& t, const std::string& name, const at::Tensor& target) {
  c10::ScalarType st;
  try {
    st = loader::ToScalarType(t.dtype, "'" + name + "'");
  } catch (const Error& e) {
    return e.what();
  }
  if (st != target.scalar_type())
    return "dtype mismatch for '" + name + "': the file has " + std::string(DTypeName(t.dtype)) + ", the target has " +
           std::string(c10::toString(target.scalar_type()));
  if (c10::isQIntType(st) || (t.flags & format::kTensorQuantized))
    return "'" + name + "' is quantized: not supported by LoadInto";
  return "";
}

// Why `target` cannot take `t`, or "" when it can.
std::string Mismatch(const TensorInfo& t, const std::string& name, const at::Tensor& target) {
  if (std::string why = loader::TargetProblem(name, target); !why.empty()) return why;
  if (std::string why = DTypeProblem(t, name, target); !why.empty()) return why;
  if (c10::IntArrayRef(t.shape) != target.sizes())
    return "size mismatch for '" + name + "': the file has shape " + Shape(t.shape) + ", the target has shape " +
           Shape(target.sizes());
  return "";
}

}  // namespace

LoadIntoReport LoadInto(const Container& container, const Targets& targets, const LoadIntoOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  const Container* c = &container;
  const std::string& path = c->path();
  loader::ResolveSlotBytes(options.base, c->superblock().chunk_bytes);
  // One container, one answer: the pickle must describe what the index does (zckpt.load reads
  // the pickle) before any target is written.
  (void)loader::VetObjectPickle(*c, options.base.allow_globals);
  LoadIntoReport report;

  // Match by name; check every match before anything is written.
  std::vector<std::pair<const std::pair<std::string, at::Tensor>*, TensorInfo>> matched;
  std::vector<bool> wanted(c->tensor_count(), false);
  std::vector<std::string> problems;
  for (const auto& target : targets) {
    std::optional<uint32_t> i = c->FindTensor(target.first);
    if (!i) {
      report.missing.push_back(target.first);
      continue;
    }
    wanted[*i] = true;
    TensorInfo info = c->tensor(*i);
    std::string why = Mismatch(info, target.first, target.second);
    if (!why.empty()) problems.push_back(why);
    matched.emplace_back(&target, std::move(info));
  }
  // Internal tensors (a DTensor's DeviceMesh) are not state entries: never "unexpected".
  for (uint32_t i = 0; i < c->tensor_count(); ++i)
    if (!wanted[i] && !(c->tensor(i).flags & format::kTensorInternal)) report.unexpected.emplace_back(c->tensor(i).name);
  if (options.strict && (!report.missing.empty() || !report.unexpected.empty())) {
    std::string keys;
    if (!report.missing.empty()) keys = "Missing key(s): " + Quoted(report.missing);
    if (!report.unexpected.empty()) keys += (keys.empty() ? "" : "; ") + ("Unexpected key(s): " + Quoted(report.unexpected));
    problems.push_back(keys);
  }
  if (!problems.empty()) {
    std::string msg = "cannot load " + path + " into the given tensors:";
    for (const auto& p : problems) msg += "\n  " + p;
    throw Error(ErrorKind::kInvalidArgument, msg);
  }

  std::vector<loader::ViewCopy> copies;
  copies.reserve(matched.size());
  for (auto& [target, info] : matched) copies.push_back(loader::ViewCopy{target->second, std::move(info)});
  loader::ViewCopyReport r = loader::CopyViews(*c, std::move(copies), options.base, t0);
  report.tensors_copied = r.copies;
  report.tensors_direct = r.direct;
  report.tensors_staged = r.staged;
  report.stats = r.stats;
  return report;
}

LoadIntoReport LoadInto(const std::string& path, const Targets& targets, const LoadIntoOptions& options) {
  return LoadInto(*Container::Open(path), targets, options);
}

LoadIntoReport LoadRanges(const std::string& path, const std::vector<RangeTarget>& ranges, const LoadOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  auto c = Container::Open(path);
  loader::ResolveSlotBytes(options, c->superblock().chunk_bytes);
  (void)loader::VetObjectPickle(*c, options.allow_globals);  // as LoadInto

  // Every range checked before anything is written.
  std::vector<std::string> problems;
  std::vector<std::pair<const RangeTarget*, TensorInfo>> matched;
  for (const RangeTarget& r : ranges) {
    std::optional<uint32_t> i = c->FindTensor(r.name);
    if (!i) {
      problems.push_back("'" + r.name + "' is not in the file");
      continue;
    }
    TensorInfo info = c->tensor(*i);
    std::string why = loader::TargetProblem(r.name, r.target);
    if (why.empty()) why = DTypeProblem(info, r.name, r.target);
    if (why.empty() && !loader::SavedContiguous(info))
      why = "'" + r.name + "' is not contiguous in its storage: element ranges need a contiguous saved tensor";
    if (why.empty() && !r.target.is_contiguous())
      why = "the target of '" + r.name + "' is not contiguous";
    const uint64_t numel = info.byte_end > info.byte_begin ? (info.byte_end - info.byte_begin) / DTypeSize(info.dtype) : 0;
    const auto count = static_cast<uint64_t>(r.target.numel());
    if (why.empty() && (r.begin > numel || count > numel - r.begin))
      why = "elements [" + std::to_string(r.begin) + ", " + std::to_string(r.begin + count) + ") of '" + r.name +
            "' are past its " + std::to_string(numel) + " elements";
    if (!why.empty()) {
      problems.push_back(why);
      continue;
    }
    matched.emplace_back(&r, std::move(info));
  }
  if (!problems.empty()) {
    std::string msg = "cannot load element ranges of " + path + ":";
    for (const auto& p : problems) msg += "\n  " + p;
    throw Error(ErrorKind::kInvalidArgument, msg);
  }

  // Each range is a 1-D view of its tensor's storage going to the target's flat alias: streamed
  // chunk by chunk straight into the target (same dtype, both contiguous).
  std::vector<loader::ViewCopy> copies;
  for (auto& [r, info] : matched) {
    const uint64_t item = DTypeSize(info.dtype);
    const auto count = static_cast<uint64_t>(r->target.numel());
    TensorInfo view = info;
    view.shape = {static_cast<int64_t>(count)};
    view.stride = {1};
    view.storage_offset = info.storage_offset + r->begin;
    view.byte_begin = info.byte_begin + r->begin * item;
    view.byte_end = count ? view.byte_begin + count * item : view.byte_begin;
    copies.push_back(loader::ViewCopy{r->target.view({-1}), std::move(view)});
  }
  loader::ViewCopyReport r = loader::CopyViews(*c, std::move(copies), options, t0);
  LoadIntoReport report;
  report.tensors_copied = r.copies;
  report.tensors_direct = r.direct;
  report.stats = r.stats;
  return report;
}

}  // namespace zckpt
