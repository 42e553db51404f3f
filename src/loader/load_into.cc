// LoadInto: the file's tensors copied in place into existing tensors, matched by name.
#include <chrono>
#include <utility>

#include "loader/copy_views.h"
#include "loader/into_check.h"
#include "loader/plan.h"
#include "loader/stream.h"
#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/format.h"
#include "zckpt/loader.h"

namespace zckpt {

namespace {

using Targets = std::vector<std::pair<std::string, at::Tensor>>;

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

  // Match by name; check every match before anything is written (into_check.h: the checks
  // Python's load_into runs too).
  std::vector<loader::TargetFacts> facts;
  facts.reserve(targets.size());
  std::vector<std::string> undefined;
  for (const auto& [name, tensor] : targets) {
    if (!tensor.defined()) undefined.push_back(loader::TargetProblem(name, tensor));
    else facts.push_back(loader::FactsOf(name, tensor));
  }
  if (!undefined.empty()) {
    std::string msg = "cannot load " + path + " into the given tensors:";
    for (const auto& p : undefined) msg += "\n  " + p;
    throw Error(ErrorKind::kInvalidArgument, msg);
  }
  loader::IntoMatch match = loader::CheckInto(*c, facts, options.strict);
  report.missing = std::move(match.missing);
  report.unexpected = std::move(match.unexpected);

  std::vector<loader::ViewCopy> copies;
  copies.reserve(match.matched.size());
  for (auto [target, tensor] : match.matched) copies.push_back(loader::ViewCopy{targets[target].second, c->tensor(tensor)});
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
