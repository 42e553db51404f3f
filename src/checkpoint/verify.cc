// One verify (include/zckpt/verify.h): a container, a DCP folder, or a folder of either, checked
// completely and reported per file. `zckpt verify` and `zckpt.verify` print or raise what it
// returns.
#include "zckpt/verify.h"


#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/dcp_layout.h"
#include "checkpoint/folder.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/source_kind.h"
#include "checkpoint/storage_stream.h"
#include "common/mapped_file.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt {

namespace {

using checkpoint::DcpLayout;
using checkpoint::DcpLayoutOf;
using checkpoint::FolderFile;
using checkpoint::FolderFiles;
using checkpoint::InFolder;
using checkpoint::IsDcpFolder;
using checkpoint::IsFolder;
using checkpoint::IsRemote;
using checkpoint::OpenFile;
using checkpoint::OpenMappedFile;
using checkpoint::ReadFileStart;
using checkpoint::WithoutTrailingSlash;

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A file's status from its problems: OK without any, corrupt when each is a finding (IsFinding),
// else not checkable.
VerifyStatus StatusOf(const std::vector<VerifyProblem>& problems) {
  if (problems.empty()) return VerifyStatus::kOk;
  for (const VerifyProblem& p : problems)
    if (!IsFinding(p.kind)) return VerifyStatus::kError;
  return VerifyStatus::kCorrupt;
}

// The problem an Error that stopped the check of `path` is: placed in `path` when it says no file.
VerifyProblem StoppedBy(const Error& e, const std::string& path) {
  VerifyProblem p = VerifyProblem::Of(e);
  if (p.place.file.empty()) p.place.file = path;
  return p;
}

// A problem of `kind` about `place`.
VerifyProblem Problem(ErrorKind kind, std::string message, ErrorPlace place) {
  return {kind, std::move(message), std::move(place)};
}

VerifyOptions ContainerOptions(const VerifyPathOptions& options) {
  VerifyOptions opt;
  opt.threads = options.threads;
  opt.progress = options.progress;
  return opt;
}

struct DcpVerifyReport {
  std::vector<VerifyProblem> problems;  // empty when the folder is good
  uint64_t containers = 0;              // containers verified in full
  uint64_t distcp_pieces = 0;           // pieces of FileSystemWriter .distcp files (no checksums)
  uint64_t tensors = 0, bytes_items = 0;
  uint64_t bytes_checked = 0;
};

// The bytes of a BytesIO item, copied (a blob's checked copy), and where they are, in words.
struct ItemBytes {
  std::vector<uint8_t> bytes;
  std::string where;
};

// A DCP folder as a whole: `.metadata` reads, every piece it lists exists where storage_data
// says with the metadata's dtype and shape, every BytesIO item is a torch.save archive zckpt's
// interpreter reads naming no code-running global (the deny list, as object pickles are read),
// and every container it names verifies in full (Container::Verify; progress counts the bytes of
// all of them). Problems are collected, not thrown; a `.metadata` that cannot be read at all
// throws (kCorrupt/kUnsafe/kIo), as does a remote folder's .distcp shard (those cannot be checked
// there). Each function below does one of these checks; Run calls them in turn.
class DcpFolderCheck {
 public:
  explicit DcpFolderCheck(const std::string& dir) : dir_(dir), md_(dcp::ReadFolderMetadata(dir)) {}

  DcpVerifyReport Run(const VerifyOptions& options) {
    if (IsRemote(dir_)) OpenRemoteDistcpShards();
    for (const pickle::DcpItem& item : md_.items) {
      if (item.is_tensor) CheckTensorItem(item);
      else CheckBytesItem(item);
    }
    VerifyContainers(options);
    return std::move(report_);
  }

 private:
  // .distcp shards in object storage cannot be checked: opening one throws (not a damaged
  // folder: exit 2).
  void OpenRemoteDistcpShards() const {
    std::set<std::string> shards;
    for (const pickle::DcpStorage& s : md_.storage)
      if (s.file_slice && shards.insert(s.relative_path).second && !dcp::ConvertedContainer(dir_, s))
        (void)OpenMappedFile(InFolder(dir_, s.relative_path), "a DCP .distcp shard");
  }

  // The folder's container at `path`, opened once; one that fails to open is left out of
  // VerifyContainers (its error is the problem of the item that opened it).
  const Container& Open(const std::string& path) {
    auto& c = containers_[path];
    if (!c) c = Container::Open(path);
    return *c;
  }

  const std::shared_ptr<const MappedFile>& Distcp(const std::string& path) {
    auto& f = distcp_[path];
    if (!f) f = OpenMappedFile(path, "a DCP .distcp shard");
    return f;
  }

  // Runs `check`; an Error from it is a problem of its kind, placed where the Error says, else
  // at `place` (the item's), its message prefixed by `what` unless it names the folder.
  template <typename F>
  void Collect(const std::string& what, const ErrorPlace& place, F&& check) {
    try {
      check();
    } catch (const Error& e) {
      VerifyProblem p = VerifyProblem::Of(e);
      if (p.message.find(dir_) == std::string::npos) p.message = what + ": " + p.message;
      if (p.place.file.empty()) p.place = place;
      report_.problems.push_back(std::move(p));
    }
  }

  std::string What(const pickle::DcpItem& item) const { return dir_ + ": '" + item.fqn + "'"; }

  ErrorPlace ItemPlace(const pickle::DcpItem& item) const {
    ErrorPlace place;
    place.file = dir_;
    if (item.is_tensor) place.tensors = {item.fqn};
    return place;
  }

  // A BytesIO item: its bytes read from wherever storage_data puts them, then vetted.
  void CheckBytesItem(const pickle::DcpItem& item) {
    const pickle::DcpStorage* s = md_.FindStorage(item.fqn, {});
    if (!s) {
      report_.problems.push_back(Problem(ErrorKind::kCorrupt, What(item) + ": no storage entry", ItemPlace(item)));
      return;
    }
    Collect(What(item), ItemPlace(item), [&] {
      ItemBytes item_bytes = BytesOf(*s);
      dcp::VetTorchSaveBytes(item_bytes.bytes, item_bytes.where,
                             checkpoint::PickleReadOptions{pickle::GlobalPolicy::kDenyListOnly, {}});
    });
    report_.bytes_items++;
  }

  // Where a BytesIO item's bytes are: a blob of a (file, name) entry's container, a blob of the
  // container converted from its .distcp file, or the .distcp file itself.
  ItemBytes BytesOf(const pickle::DcpStorage& s) {
    if (!s.file_slice) return BlobBytes(InFolder(dir_, s.relative_path), s.name);
    if (std::optional<std::string> converted = dcp::ConvertedContainer(dir_, s))
      return BlobBytes(*converted, std::string(dcp::kBytesAtBlob) + std::to_string(s.file_offset));
    return DistcpBytes(s);
  }

  ItemBytes BlobBytes(const std::string& container, const std::string& name) {
    const Container& c = Open(container);
    return {checkpoint::CheckedBlob(c, name, "the folder's .metadata"), c.path() + " blob '" + name + "'"};
  }

  ItemBytes DistcpBytes(const pickle::DcpStorage& s) {
    std::string file = InFolder(dir_, s.relative_path);
    const auto& f = Distcp(file);
    if (s.file_offset > f->size() || s.length > f->size() - s.file_offset)
      throw Error(ErrorKind::kCorrupt, file + ": the item lies past the end of the file");
    ItemBytes out{f->CopyView({f->data() + s.file_offset, s.length}),
                  file + " bytes [" + std::to_string(s.file_offset) + ", " + std::to_string(s.file_offset + s.length) + ")"};
    report_.distcp_pieces++;
    return out;
  }

  // A tensor item: every piece the metadata lists.
  void CheckTensorItem(const pickle::DcpItem& item) {
    for (const pickle::DcpChunk& chunk : item.chunks) {
      const pickle::DcpStorage* s = md_.FindStorage(item.fqn, chunk.offsets);
      if (!s) {
        report_.problems.push_back(Problem(
            ErrorKind::kCorrupt, What(item) + ": no storage entry for the piece at " + dcp::Dims(chunk.offsets), ItemPlace(item)));
        continue;
      }
      Collect(What(item), ItemPlace(item), [&] {
        dcp::PieceLocation loc = dcp::LocatePiece(dir_, *s, [this](const std::string& path) -> const Container& { return Open(path); });
        if (loc.container) CheckContainerPiece(item, *s, loc);
        else CheckDistcpPiece(item, *s, loc);
      });
      report_.tensors++;
    }
  }

  // A piece that is a tensor record of a container: there, with the metadata's dtype and shape.
  void CheckContainerPiece(const pickle::DcpItem& item, const pickle::DcpStorage& s, const dcp::PieceLocation& loc) {
    const Container& c = Open(loc.file);
    auto t = c.FindTensor(loc.tensor);
    if (!t) throw Error(ErrorKind::kCorrupt, c.path() + ": no tensor '" + loc.tensor + "' (the piece of '" + item.fqn + "')");
    TensorInfo info = c.tensor(*t);
    if (auto why = dcp::PieceMismatch(item, s, info.dtype, info.shape))
      throw Error(ErrorKind::kCorrupt, c.path() + ": tensor '" + loc.tensor + "': " + *why, PiecePlace(loc.file, loc.tensor));
  }

  // A piece that is a torch.save archive in a .distcp file: one tensor with the metadata's dtype
  // and shape.
  void CheckDistcpPiece(const pickle::DcpItem& item, const pickle::DcpStorage& s, const dcp::PieceLocation& loc) {
    dcp::DistcpTensor t = dcp::ReadDistcpTensor(Distcp(loc.file), loc.offset, loc.length);
    report_.distcp_pieces++;
    if (auto why = dcp::PieceMismatch(item, s, t.view.dtype, t.view.shape))
      throw Error(ErrorKind::kCorrupt, loc.file + ": " + *why, PiecePlace(loc.file, item.fqn));
  }

  static ErrorPlace PiecePlace(const std::string& file, const std::string& tensor) {
    ErrorPlace place;
    place.file = file;
    place.tensors = {tensor};
    return place;
  }

  // Every container the checks above opened, in full, progress counted over all of them.
  void VerifyContainers(const VerifyOptions& options) {
    uint64_t total = 0, before = 0;
    for (auto& [path, c] : containers_)
      if (c) total += c->file_bytes();
    VerifyOptions vo = options;
    if (options.progress) vo.progress = [&](uint64_t done, uint64_t) { options.progress(before + done, total); };
    for (auto& [path, c] : containers_) {
      if (!c) continue;
      VerifyReport r = c->Verify(vo);
      for (VerifyProblem& p : r.problems) report_.problems.push_back(std::move(p));
      report_.bytes_checked += r.bytes_checked;
      report_.containers++;
      before += c->file_bytes();
    }
  }

  const std::string dir_;
  const pickle::DcpMetadata md_;
  std::map<std::string, std::unique_ptr<Container>> containers_;
  std::map<std::string, std::shared_ptr<const MappedFile>> distcp_;
  DcpVerifyReport report_;
};

VerifiedFile VerifyContainer(const std::string& path, const VerifyPathOptions& options) {
  VerifiedFile r;
  r.path = path;
  auto t0 = std::chrono::steady_clock::now();
  try {
    auto c = Container::Open(path);
    r.bytes = c->file_bytes();
    if (options.on_begin) options.on_begin(path, c->file_bytes());
    r.problems = c->Verify(ContainerOptions(options)).problems;
    for (VerifyProblem& p : checkpoint::ObjectPickleProblems(*c)) r.problems.push_back(std::move(p));
  } catch (const Error& e) {
    Error hinted = checkpoint::WithNotAContainerHint(e, path);
    r.problems.push_back(StoppedBy(hinted, path));
    r.error = hinted.kind();
  }
  r.status = StatusOf(r.problems);
  r.seconds = SecondsSince(t0);
  return r;
}

VerifiedFile VerifyDcp(const std::string& dir, const VerifyPathOptions& options) {
  VerifiedFile r;
  r.path = dir;
  r.dcp = true;
  auto t0 = std::chrono::steady_clock::now();
  try {
    if (options.on_begin) options.on_begin(dir, 0);
    DcpVerifyReport report = DcpFolderCheck(dir).Run(ContainerOptions(options));
    r.problems = std::move(report.problems);
    r.bytes = report.bytes_checked;
    r.containers = report.containers;
    r.distcp_pieces = report.distcp_pieces;
    r.tensors = report.tensors;
    r.bytes_items = report.bytes_items;
  } catch (const Error& e) {
    r.problems.push_back(StoppedBy(e, dir));
    r.error = e.kind();
  }
  r.status = StatusOf(r.problems);
  r.seconds = SecondsSince(t0);
  return r;
}

bool HasContainerMagic(const std::string& path, uint64_t size) {
  constexpr size_t n = sizeof format::kSuperblockMagic;
  if (size < n) return false;
  std::string head;
  try {
    head = ReadFileStart(path, n);  // an object: one ranged GET; its verify opens it once more
  } catch (const Error&) {
    // An object that cannot be read is reported by its verify, not passed over; a local path
    // that is no regular file is no container.
    return IsRemote(path);
  }
  return head.size() == n && std::memcmp(head.data(), format::kSuperblockMagic, n) == 0;
}

// What a path stands for: itself, or for a folder (local, or an object folder s3://B/PREFIX/)
// every container below it, sorted, a DCP folder (the path itself or one below it) standing for
// its own files as one entry. A folder that cannot be walked, or holds nothing to check, sets
// `error`.
struct Target {
  std::vector<std::pair<std::string, bool>> files;  // (path, is a DCP folder)
  std::string error;
};

Target Expand(const std::string& given) {
  Target t;
  const std::string path = IsRemote(given) ? WithoutTrailingSlash(given) : given;
  bool folder = false;
  try {
    folder = IsFolder(given);  // an object URL ending in '/' is a folder without a lookup
  } catch (const Error&) {
    // Storage that does not answer: checked as one object, whose open says what went wrong.
  }
  const bool dcp_folder = folder && IsDcpFolder(path);
  if (!folder || dcp_folder) {
    t.files.emplace_back(path, dcp_folder);
    return t;
  }
  std::vector<FolderFile> files;
  try {
    files = FolderFiles(path, /*recursive=*/true);
  } catch (const Error& e) {
    t.error = e.what();
    return t;
  }
  // The folders below that are DCP checkpoints, from the listing: each one entry, its files not
  // looked at one by one.
  std::map<std::string, std::vector<std::string>> own;  // folder ("" the top) -> its files' names
  for (const FolderFile& f : files) {
    size_t slash = f.name.rfind('/');
    own[slash == std::string::npos ? "" : f.name.substr(0, slash)].push_back(
        slash == std::string::npos ? f.name : f.name.substr(slash + 1));
  }
  std::set<std::string> dcp;
  for (const auto& [dir, names] : own)
    if (!dir.empty() && DcpLayoutOf(names) != DcpLayout::kNone) dcp.insert(dir);
  auto below_dcp = [&](const std::string& name) {
    for (size_t slash = name.find('/'); slash != std::string::npos; slash = name.find('/', slash + 1))
      if (dcp.count(name.substr(0, slash))) return true;
    return false;
  };
  std::set<std::string> outer;  // DCP folders not inside another one
  for (const std::string& dir : dcp)
    if (!below_dcp(dir)) outer.insert(dir);
  for (const std::string& dir : outer) t.files.emplace_back(InFolder(path, dir), true);
  for (const FolderFile& f : files)
    if (!below_dcp(f.name) && HasContainerMagic(InFolder(path, f.name), f.size))
      t.files.emplace_back(InFolder(path, f.name), false);
  if (t.files.empty()) t.error = path + ": no zckpt container below this folder (nor a DCP checkpoint)";
  std::sort(t.files.begin(), t.files.end());
  return t;
}

}  // namespace

std::vector<VerifiedFile> VerifyPath(const std::string& path, const VerifyPathOptions& options) {
  std::vector<VerifiedFile> out;
  auto add = [&](VerifiedFile r) {
    if (options.on_file) options.on_file(r);
    out.push_back(std::move(r));
  };
  Target target = Expand(path);
  if (!target.error.empty()) {
    VerifiedFile r;
    r.path = path;
    r.status = VerifyStatus::kError;
    r.error = ErrorKind::kInvalidArgument;
    ErrorPlace place;
    place.file = path;
    r.problems.push_back(Problem(ErrorKind::kInvalidArgument, target.error, std::move(place)));
    add(std::move(r));
  }
  for (const auto& [file, dcp] : target.files) add(dcp ? VerifyDcp(file, options) : VerifyContainer(file, options));
  return out;
}

}  // namespace zckpt
