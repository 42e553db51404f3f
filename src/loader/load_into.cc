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

// Why `target` cannot take `t`, or "" when it can.
std::string Mismatch(const TensorInfo& t, const std::string& name, const at::Tensor& target) {
  if (std::string why = loader::TargetProblem(name, target); !why.empty()) return why;
  if (std::string why = loader::DTypeProblem(t, name, target); !why.empty()) return why;
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
  loader::ResolveContainerLoad(options.base, *c);
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

}  // namespace zckpt
