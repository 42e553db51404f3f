#include "checkpoint/source_kind.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "checkpoint/file_names.h"
#include "checkpoint/folder.h"
#include "pt/pt_format.h"
#include "pt/zip_reader.h"
#include "safetensors/header.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::checkpoint {

namespace {

constexpr uint8_t kGgufMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint8_t kNpyMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

bool StartsWith(std::span<const uint8_t> head, const uint8_t* magic, size_t n) {
  return head.size() >= n && std::memcmp(head.data(), magic, n) == 0;
}

// A zip: a torch.save archive, a TorchScript archive (torch.jit.save: constants.pkl and code/
// under the archive folder), a numpy .npz (nothing but .npy members), or some other zip.
SourceKind ClassifyZip(const std::shared_ptr<const MappedFile>& file, bool named_torch) {
  try {
    pt::ZipArchive zip(file);
    bool all_npy = !zip.entries().empty(), torchscript = false;
    for (const pt::ZipEntry& e : zip.entries()) {
      all_npy &= EndsWith(e.name, ".npy");
      size_t slash = e.name.find('/');
      if (slash != std::string::npos) {
        std::string_view rest = std::string_view(e.name).substr(slash + 1);
        torchscript |= rest == "constants.pkl" || rest.substr(0, 5) == "code/";
      }
    }
    if (torchscript) return SourceKind::kTorchScript;
    if (all_npy) return SourceKind::kNumpyNpz;
    // torch.load reads "<first entry's folder>/data.pkl"; a zip without one is some other zip,
    // unless it is named like a torch.save file (then the converter says what it lacks).
    const std::string& first = zip.entries().front().name;
    size_t slash = first.find('/');
    bool has_pickle = slash != std::string::npos && zip.Find(first.substr(0, slash + 1) + "data.pkl");
    if (!has_pickle && !named_torch) return SourceKind::kUnknown;
  } catch (const Error&) {
    // The converter's own reading says what is wrong with it.
  }
  return SourceKind::kTorchZip;
}

}  // namespace

SourceKind DetectSource(const std::shared_ptr<const MappedFile>& file) {
  const std::string name = AsciiLower(BaseName(file->path()));
  if (EndsWith(name, ".distcp")) return SourceKind::kDcpShard;  // starts like a torch.save zip
  if (name == ".metadata") {  // DCP's only when .distcp shards sit beside it
    std::string parent = std::filesystem::path(file->path()).parent_path().string();
    if (IsDcpFolder(parent.empty() ? "." : parent)) return SourceKind::kDcpMetadata;
  }
  std::span<const uint8_t> head(file->data(), std::min<size_t>(file->size(), pt::kPtFormatProbeBytes));
  if (StartsWith(head, format::kSuperblockMagic, sizeof format::kSuperblockMagic)) return SourceKind::kZckpt;
  if (StartsWith(head, kGgufMagic, sizeof kGgufMagic)) return SourceKind::kGguf;
  if (StartsWith(head, kNpyMagic, sizeof kNpyMagic)) return SourceKind::kNumpyNpy;
  pt::PtFormat pt = pt::DetectPtFormat(head);
  if (pt == pt::PtFormat::kZip)
    return ClassifyZip(file, EndsWith(name, ".pt") || EndsWith(name, ".pth") || EndsWith(name, ".bin"));
  if (pt == pt::PtFormat::kLegacy) return SourceKind::kTorchLegacy;
  // Before the tar test: a header could hold "ustar" at byte 257.
  if (safetensors::LooksLikeSafetensors(head, file->size())) return SourceKind::kSafetensors;
  if (pt == pt::PtFormat::kLegacyTar) return SourceKind::kTorchLegacyTar;
  // Named like one but malformed: the safetensors reader says how.
  if (EndsWith(name, ".safetensors")) return SourceKind::kSafetensors;
  return SourceKind::kUnknown;
}

SourceKind DetectSource(const std::string& path) { return DetectSource(std::make_shared<const MappedFile>(path)); }

bool IsConvertible(SourceKind kind) {
  return kind == SourceKind::kTorchZip || kind == SourceKind::kTorchLegacy || kind == SourceKind::kSafetensors;
}

const char* SourceKindName(SourceKind kind) {
  switch (kind) {
    case SourceKind::kTorchZip: return "torch.save (zip)";
    case SourceKind::kTorchLegacy: return "torch.save (legacy)";
    case SourceKind::kSafetensors: return "safetensors";
    case SourceKind::kTorchLegacyTar: return "torch.save (tar, torch <= 0.3)";
    case SourceKind::kZckpt: return "zckpt container";
    case SourceKind::kTorchScript: return "TorchScript archive";
    case SourceKind::kDcpShard: return "torch.distributed.checkpoint shard";
    case SourceKind::kDcpMetadata: return "torch.distributed.checkpoint metadata";
    case SourceKind::kGguf: return "GGUF file";
    case SourceKind::kNumpyNpz: return "numpy .npz archive";
    case SourceKind::kNumpyNpy: return "numpy .npy file";
    case SourceKind::kUnknown: return "unknown";
  }
  return "unknown";
}

std::string DcpAdvice(const std::string& dir) {
  return "a DCP checkpoint is its folder: `zckpt convert " + dir + " -o OUTDIR` converts it as a whole (each .distcp "
         "file to a container zckpt.dcp.ZckptStorageReader loads at any world size), `zckpt merge " + dir +
         " -o OUT` writes the full model";
}

std::string WhyNotConverted(SourceKind kind, const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = std::filesystem::path(path.empty() ? "DIR" : ".");
  const std::string dir = parent.string();
  const std::string converts = "zckpt converts torch.save and safetensors files";
  switch (kind) {
    case SourceKind::kZckpt:
      return "already a zckpt container: nothing to convert (`zckpt verify` checks it, `zckpt export` writes it back "
             "as a .pt)";
    case SourceKind::kTorchScript:
      return "a TorchScript archive (torch.jit.save), not a torch.save checkpoint: load it with torch.jit.load; " +
             converts;
    case SourceKind::kDcpShard:
      return "a shard of a torch.distributed.checkpoint (DCP) folder, not a torch.save file, and not converted alone; " +
             DcpAdvice(dir);
    case SourceKind::kDcpMetadata:
      return "the .metadata of a torch.distributed.checkpoint (DCP) folder, not converted alone; " + DcpAdvice(dir);
    case SourceKind::kGguf: return "a GGUF file (llama.cpp/ggml), not a PyTorch checkpoint; " + converts;
    case SourceKind::kNumpyNpz: return "a numpy .npz archive (numpy.savez), not a PyTorch checkpoint; " + converts;
    case SourceKind::kNumpyNpy: return "a numpy .npy file (numpy.save), not a PyTorch checkpoint; " + converts;
    case SourceKind::kTorchLegacyTar:
      return "the tar-based torch.save format of torch <= 0.3, which zckpt does not read: load and re-save it with "
             "a current torch";
    case SourceKind::kUnknown: return "not a torch.save file, nor a safetensors file";
    default: return "";
  }
}

namespace {

// FileSystemWriter's shard names are `__<rank>_<n>.distcp`; zckpt's layout keeps the stem.
bool IsDcpContainerName(const std::string& name) {
  size_t i = 2;
  auto digits = [&] {
    size_t from = i;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
    return i > from;
  };
  if (name.rfind("__", 0) != 0 || !digits() || i >= name.size() || name[i++] != '_' || !digits()) return false;
  return name.compare(i, std::string::npos, ".zckpt") == 0;
}

}  // namespace

DcpLayout DcpLayoutOf(const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), ".metadata") == names.end()) return DcpLayout::kNone;
  DcpLayout layout = DcpLayout::kNone;
  for (const std::string& name : names) {
    if (EndsWith(AsciiLower(name), ".distcp")) return DcpLayout::kDistcp;
    if (IsDcpContainerName(name)) layout = DcpLayout::kContainers;
  }
  return layout;
}

DcpLayout DcpFolderLayout(const std::string& dir) {
  if (!IsRemote(dir)) {  // the common answer locally, without walking the folder
    std::error_code ec;
    if (!std::filesystem::is_regular_file(std::filesystem::path(dir) / ".metadata", ec)) return DcpLayout::kNone;
  }
  std::vector<std::string> names;
  try {
    for (FolderFile& f : FolderFiles(dir, /*recursive=*/false)) names.push_back(std::move(f.name));
  } catch (const Error&) {
    return DcpLayout::kNone;  // not a folder (an object's key, a file): whoever opens it says why
  }
  return DcpLayoutOf(names);
}

bool IsDcpFolder(const std::string& dir) { return DcpFolderLayout(dir) != DcpLayout::kNone; }

std::optional<std::string> NotAContainerHint(const std::string& path) {
  try {
    SourceKind kind = DetectSource(path);
    if (IsConvertible(kind))
      return path + " is a " + SourceKindName(kind) + " file, not a zckpt container: convert it first with `zckpt convert " +
             path + "` (or zckpt.convert)";
    if (kind != SourceKind::kUnknown && kind != SourceKind::kZckpt) return path + " is " + WhyNotConverted(kind, path);
  } catch (const Error&) {
  }
  return std::nullopt;
}

}  // namespace zckpt::checkpoint

namespace zckpt::checkpoint {

Error WithNotAContainerHint(const Error& e, const std::string& path) {
  if (e.kind() != ErrorKind::kNotContainer) return e;
  std::optional<std::string> hint = NotAContainerHint(path);
  return hint ? Error(e.kind(), std::string(e.what()) + "\n  hint: " + *hint, e.place()) : e;
}

}  // namespace zckpt::checkpoint
