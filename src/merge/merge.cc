// MergeCheckpoint (include/zckpt/merge.h): discover and check the pieces, then write one full
// tensor at a time into a container or safetensors files.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "common/shape.h"
#include "checkpoint/dcp_layout.h"
#include "checkpoint/folder.h"
#include "merge/assemble.h"
#include "merge/layouts.h"
#include "pickle/json_writer.h"
#include "pickle/torch_save_pickle.h"
#include "safetensors/header_writer.h"
#include "zckpt/container_writer.h"
#include "zckpt/error.h"
#include "zckpt/format.h"
#include "zckpt/merge.h"

namespace zckpt {

namespace fs = std::filesystem;

namespace {

// One full tensor's bytes at a time (the merge's whole host memory beside a chunk).
struct Buffer {
  std::unique_ptr<uint8_t[]> data;
  uint64_t size = 0;
  uint8_t* Get(uint64_t bytes) {
    if (bytes > size || bytes < size / 2) {  // shrink too: the largest tensor need not stay resident
      data.reset();
      data.reset(new uint8_t[std::max<uint64_t>(bytes, 1)]);
      size = bytes;
    }
    return data.get();
  }
};

void MergeToContainer(merge::Checkpoint& ck, const std::string& out, const MergeOptions& options, MergeStats& stats) {
  ContainerWriter w(out, options.writer);
  merge::Assembler assembler;
  Buffer buffer;
  std::vector<pickle::DictTensor> pickled;
  uint64_t done = 0;
  for (uint32_t i = 0; i < ck.tensors.size(); ++i) {
    const merge::FullTensor& t = ck.tensors[i];
    uint64_t bytes = t.bytes();
    uint8_t* data = buffer.Get(bytes);
    assembler.Assemble(t, data);
    std::string key = std::to_string(i);
    uint32_t s = w.AddStorage(NewStorage{key, "cpu", t.dtype, false}, {data, bytes});
    NewTensor nt;
    nt.name = t.name;
    nt.storage = s;
    nt.dtype = t.dtype;
    nt.shape = t.shape;
    nt.stride = ContiguousStrides(t.shape);
    w.AddTensor(nt);
    pickled.push_back(pickle::DictTensor{t.name, key, t.dtype, t.shape});
    done += bytes;
    if (options.progress) options.progress(done, stats.bytes);
  }
  std::string pkl = pickle::TorchSavePickleOfTensorDict(pickled);
  w.AddBlob(std::string(format::kObjectPickleBlob), {reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size()});
  w.SetMetadata("zckpt.merge.layout", ck.layout);
  w.Commit();
  stats.written.push_back(out);
}

// safetensors' entry for a torch dtype; nullopt when it has none, or counts elements otherwise
// than torch (F4: the header's shape would not be the tensor's).
std::optional<safetensors::DTypeInfo> SafetensorsDtype(DType d) {
  auto info = safetensors::FindTorchDType(d);
  if (!info || info->bits < 8) return std::nullopt;
  return info;
}

std::string ShardName(size_t k, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}

// The files of huggingface/ copied beside the merged weights, by name: its own weights (if any)
// are not the merged ones and are left out.
std::vector<std::string> HuggingFaceFiles(const std::string& from) {
  std::vector<std::string> names;
  if (from.empty()) return names;
  for (checkpoint::FolderFile& f : checkpoint::FolderFiles(from, /*recursive=*/false)) {
    std::string name = std::move(f.name);
    // Weights (a converted folder's .zckpt too: a second full copy) and their indexes.
    if (dcp::EndsWith(name, ".safetensors") || dcp::EndsWith(name, ".bin") || dcp::EndsWith(name, ".zckpt") ||
        dcp::EndsWith(name, ".index.json"))  // (writers' temporaries: FolderFiles leaves them out)
      continue;
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void CopyFolderFiles(const std::string& from, const std::string& to, MergeStats& stats) {
  for (const std::string& name : HuggingFaceFiles(from)) {
    checkpoint::CopyFileTo(checkpoint::InFolder(from, name), checkpoint::InFolder(to, name));
    stats.written.push_back(checkpoint::InFolder(to, name));
  }
}

// Tensors into safetensors files in order, each up to max_shard_bytes (one bigger tensor alone).
std::vector<std::vector<size_t>> PlanShards(const merge::Checkpoint& ck, uint64_t max_shard_bytes) {
  for (const merge::FullTensor& t : ck.tensors)
    if (!SafetensorsDtype(t.dtype))
      throw Error(ErrorKind::kUnsupported, "tensor '" + t.name + "' is " + std::string(DTypeName(t.dtype)) +
                                               ", which safetensors has no dtype for (merge into a .zckpt instead)");
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < ck.tensors.size(); ++i) {
    uint64_t b = ck.tensors[i].bytes();
    if (!shards.back().empty() && in_shard + b > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
  }
  return shards;
}

// Every file a merge into `out` writes, known before the first is.
std::vector<std::string> PlannedOutputs(const merge::Checkpoint& ck, const std::string& out, bool container,
                                        const std::vector<std::vector<size_t>>& shards) {
  if (container) return {out};
  std::vector<std::string> files;
  for (size_t k = 0; k < shards.size(); ++k) files.push_back(checkpoint::InFolder(out, ShardName(k, shards.size())));
  if (shards.size() > 1) files.push_back(checkpoint::InFolder(out, "model.safetensors.index.json"));
  for (const std::string& name : HuggingFaceFiles(ck.huggingface_dir)) files.push_back(checkpoint::InFolder(out, name));
  return files;
}

void MergeToHuggingFace(merge::Checkpoint& ck, const std::string& out, const std::vector<std::vector<size_t>>& shards,
                        const MergeOptions& options, MergeStats& stats) {
  if (!checkpoint::IsRemote(out)) {  // an object folder is only its keys' common prefix
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) throw Error(ErrorKind::kIo, out + ": cannot create the folder: " + ec.message());
  }
  merge::Assembler assembler;
  Buffer buffer;
  uint64_t done = 0;
  pickle::JsonObject weight_map;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = ShardName(k, shards.size());
    // The header first: every offset is known from the shapes.
    std::vector<safetensors::TensorEntry> entries;
    uint64_t offset = 0;
    for (size_t i : shards[k]) {
      const merge::FullTensor& t = ck.tensors[i];
      entries.push_back(safetensors::TensorEntry{t.name, *SafetensorsDtype(t.dtype),
                                                 std::vector<uint64_t>(t.shape.begin(), t.shape.end()), offset,
                                                 offset + t.bytes()});
      weight_map.String(t.name, name);
      offset += t.bytes();
    }
    std::string h = safetensors::FormatHeader(entries, /*has_metadata=*/true, {{"format", "pt"}});
    uint8_t len[8];
    for (int b = 0; b < 8; ++b) len[b] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * b));
    checkpoint::OutputFile f(checkpoint::InFolder(out, name));
    f.Write(len, sizeof len);
    f.Write(h.data(), h.size());
    for (size_t i : shards[k]) {
      const merge::FullTensor& t = ck.tensors[i];
      uint64_t bytes = t.bytes();
      uint8_t* data = buffer.Get(bytes);
      assembler.Assemble(t, data);
      f.Write(data, bytes);
      done += bytes;
      if (options.progress) options.progress(done, stats.bytes);
    }
    f.Commit();
    stats.written.push_back(checkpoint::InFolder(out, name));
  }
  if (shards.size() > 1) {
    pickle::JsonObject metadata;
    metadata.Int("total_size", static_cast<int64_t>(stats.bytes));
    pickle::JsonObject index;
    index.Raw("metadata", metadata.str());
    index.Raw("weight_map", weight_map.str());
    std::string text = index.str() + "\n";
    checkpoint::WriteWholeFile(checkpoint::InFolder(out, "model.safetensors.index.json"), text);
    stats.written.push_back(checkpoint::InFolder(out, "model.safetensors.index.json"));
  }
  if (!ck.huggingface_dir.empty()) CopyFolderFiles(ck.huggingface_dir, out, stats);
  stats.config_copied = !ck.huggingface_dir.empty() && checkpoint::FileExists(checkpoint::InFolder(ck.huggingface_dir, "config.json")) &&
                        checkpoint::FileExists(checkpoint::InFolder(out, "config.json"));
}

}  // namespace

void CheckDcpTiling(const std::string& dir) { merge::CheckDcpTilingOf(dir); }

MergeStats MergeCheckpoint(const std::string& dir, const std::string& out, const MergeOptions& options) {
  merge::Checkpoint ck = merge::Discover(dir, options);
  if (!options.huggingface_dir.empty()) {
    if (!checkpoint::IsFolder(options.huggingface_dir))
      throw Error(ErrorKind::kInvalidArgument, options.huggingface_dir + ": not a folder (the Hugging Face config to copy)");
    ck.huggingface_dir = options.huggingface_dir;
  }
  MergeStats stats;
  stats.layout = ck.layout;
  stats.tensors = ck.tensors.size();
  for (const merge::FullTensor& t : ck.tensors) {
    stats.pieces += t.pieces.size();
    stats.bytes += t.bytes();
    stats.largest_tensor = std::max(stats.largest_tensor, t.bytes());
  }
  const bool container = dcp::EndsWith(out, ".zckpt");
  std::vector<std::vector<size_t>> shards;
  if (!container) shards = PlanShards(ck, options.max_shard_bytes);
  if (!options.overwrite) {
    std::vector<std::string> existing;
    for (const std::string& f : PlannedOutputs(ck, out, container, shards)) {
      struct stat st;
      if (checkpoint::IsRemote(f) ? checkpoint::FileExists(f) : ::lstat(f.c_str(), &st) == 0) existing.push_back(f);
    }
    if (!existing.empty()) {
      std::string msg = std::to_string(existing.size()) + (existing.size() == 1 ? " output exists" : " outputs exist") +
                        " (" + existing[0] + (existing.size() > 1 ? ", ..." : "") + "); nothing was written (--force overwrites)";
      throw Error(ErrorKind::kInvalidArgument, msg);
    }
  }
  if (container) MergeToContainer(ck, out, options, stats);
  else MergeToHuggingFace(ck, out, shards, options, stats);
  return stats;
}

}  // namespace zckpt
