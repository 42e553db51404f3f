#include "zckpt/convert_folder.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "convert/hf_index.h"
#include "checkpoint/folder.h"
#include "checkpoint/source_kind.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt {

namespace fs = std::filesystem;

namespace {

std::string Normal(const fs::path& p) { return p.lexically_normal().string(); }

}  // namespace

FolderPlan PlanFolder(const std::string& src, const std::string& out, bool only_pt) {
  using checkpoint::SourceKind;
  FolderPlan plan;
  if (checkpoint::IsDcpFolder(src)) {  // either layout: ConvertDcpFolder says what it cannot do
    plan.jobs.push_back(FolderJob{src, out, FolderJob::Action::kConvertDcp, "", ""});
    return plan;
  }
  for (fs::recursive_directory_iterator it(src), end; it != end; ++it) {
    const fs::directory_entry& entry = *it;
    if (entry.is_directory() && !entry.is_symlink() &&
        checkpoint::DcpFolderLayout(entry.path().string()) == checkpoint::DcpLayout::kDistcp) {
      const fs::path rel = fs::relative(entry.path(), src);
      plan.jobs.push_back(FolderJob{entry.path().string(), (fs::path(out) / rel).string(), FolderJob::Action::kConvertDcp, "", ""});
      it.disable_recursion_pending();
      continue;
    }
    if (!entry.is_regular_file()) continue;
    fs::path rel = fs::relative(entry.path(), src);
    const std::string name = rel.filename().string();
    if (name.find(".zckpt-tmp-") != std::string::npos) continue;  // a stale temp of ours
    FolderJob job;
    job.source = entry.path().string();
    const fs::path dst = fs::path(out) / rel;
    job.destination = dst.string();
    if (convert::IsShardIndexName(name)) {
      job.action = FolderJob::Action::kRewriteIndex;
      // model.safetensors.index.json naming .zckpt shards would send transformers to read a
      // container as safetensors (or torch.load, "Unsupported operand"): the converted index is
      // model.zckpt.index.json, which tools that cannot read containers plainly do not find.
      const std::string indexed = name.substr(0, name.size() - std::string(".index.json").size());
      job.destination = (dst.parent_path() / (fs::path(DefaultDestination(indexed)).filename().string() + ".index.json")).string();
      plan.jobs.push_back(job);
      continue;
    }
    SourceKind kind = checkpoint::DetectSource(job.source);
    if (checkpoint::IsConvertible(kind) || (IsCheckpointName(name) && kind == SourceKind::kUnknown)) {
      // A checkpoint's name on something else: the converter says what is wrong with it.
      job.action = FolderJob::Action::kConvert;
      job.destination = DefaultDestination(job.destination);
    } else if (kind == SourceKind::kUnknown || kind == SourceKind::kZckpt || kind == SourceKind::kDcpMetadata) {
      // kDcpMetadata here: the .metadata of zckpt's own DCP layout (a .distcp folder is one job
      // above), copied with its containers.
      if (only_pt) continue;
      job.action = FolderJob::Action::kCopy;
    } else {
      job.action = FolderJob::Action::kForeign;
      job.why = checkpoint::WhyNotConverted(kind, job.source);
      job.kind = checkpoint::SourceKindName(kind);
    }
    plan.jobs.push_back(job);
  }
  std::sort(plan.jobs.begin(), plan.jobs.end(), [](const FolderJob& a, const FolderJob& b) { return a.source < b.source; });
  return plan;
}

void RewriteIndex(const FolderJob& job, const FolderPlan& plan) {
  std::set<std::string> converted;
  for (const FolderJob& j : plan.jobs)
    if (j.action == FolderJob::Action::kConvert) converted.insert(Normal(j.source));
  const fs::path dir = fs::path(job.source).parent_path();
  std::string text = checkpoint::ReadWholeFile(job.source);  // read once, privately
  std::string rewritten = convert::RewriteShardIndex(
      text,
      [&](const std::string& shard) -> std::optional<std::string> {
        if (!converted.count(Normal(dir / shard))) return std::nullopt;  // not ours to rename
        return DefaultDestination(shard);
      },
      job.source);
  checkpoint::WriteWholeFile(job.destination, rewritten);
}

void CopyFile(const std::string& source, const std::string& destination) { checkpoint::CopyFileTo(source, destination); }

}  // namespace zckpt
