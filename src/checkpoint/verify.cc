// One verify (include/zckpt/verify.h): a container, a DCP folder, or a folder of either, checked
// completely and reported per file. `zckpt verify` and `zckpt.verify` print or raise what it
// returns.
#include "zckpt/verify.h"

#include <sys/stat.h>
#include <unistd.h>

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
#include "common/open_file.h"
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
  uint64_t containers = 0;            // containers verified in full
  uint64_t distcp_pieces = 0;         // pieces of FileSystemWriter .distcp files (no checksums)
  uint64_t tensors = 0, bytes_items = 0;
  uint64_t bytes_checked = 0;
};

// A DCP folder as a whole: `.metadata` reads, every piece it lists exists where storage_data
// says with the metadata's dtype and shape, every BytesIO item is a torch.save archive zckpt's
// interpreter reads naming no code-running global (the deny list, as object pickles are read),
// and every container it names verifies in full (Container::Verify with `options`; progress
// counts the bytes of all of them). Problems are collected, not thrown; a `.metadata` that
// cannot be read at all throws (kCorrupt/kUnsafe/kIo).
DcpVerifyReport VerifyDcpFolder(const std::string& dir, const VerifyOptions& options) {
  DcpVerifyReport report;
  pickle::DcpMetadata md = dcp::ReadFolderMetadata(dir);
  if (IsRemote(dir)) {  // .distcp shards there cannot be checked (not a damaged folder: exit 2)
    std::set<std::string> shards;
    for (const pickle::DcpStorage& s : md.storage)
      if (s.file_slice && shards.insert(s.relative_path).second && !dcp::ConvertedContainer(dir, s))
        (void)OpenMappedFile(InFolder(dir, s.relative_path), "a DCP .distcp shard");
  }
  std::map<std::string, std::unique_ptr<Container>> containers;
  std::map<std::string, std::shared_ptr<const MappedFile>> distcp;
  std::set<std::string> unopenable;
  auto open = [&](const std::string& path) -> const Container& {
    auto& c = containers[path];
    if (!c) c = Container::Open(path);
    return *c;
  };
  // An Error checking an item is a problem of its kind, placed where the Error says, else at the
  // item (the folder, and the tensor for a tensor item).
  auto check = [&](const std::string& what, const ErrorPlace& item_place, auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      VerifyProblem p = VerifyProblem::Of(e);
      if (p.message.find(dir) == std::string::npos) p.message = what + ": " + p.message;
      if (p.place.file.empty()) p.place = item_place;
      report.problems.push_back(std::move(p));
    }
  };
  for (const pickle::DcpItem& item : md.items) {
    const std::string what = dir + ": '" + item.fqn + "'";
    ErrorPlace item_place;
    item_place.file = dir;
    if (item.is_tensor) item_place.tensors = {item.fqn};
    if (!item.is_tensor) {
      const pickle::DcpStorage* s = md.FindStorage(item.fqn, {});
      if (!s) {
        report.problems.push_back(Problem(ErrorKind::kCorrupt, what + ": no storage entry", item_place));
        continue;
      }
      check(what, item_place, [&] {
        std::span<const uint8_t> bytes;
        std::vector<uint8_t> checked;  // a private copy (a blob's checked one): what `bytes` views
        std::string where;
        std::shared_ptr<const MappedFile> slice_file;
        if (!s->file_slice) {
          const Container& c = open(InFolder(dir, s->relative_path));
          checked = checkpoint::CheckedBlob(c, s->name, "the folder's .metadata");
          bytes = checked;
          where = c.path() + " blob '" + s->name + "'";
        } else {
          if (std::optional<std::string> converted = dcp::ConvertedContainer(dir, *s)) {
            const Container& c = open(*converted);
            std::string name = std::string(dcp::kBytesAtBlob) + std::to_string(s->file_offset);
            checked = checkpoint::CheckedBlob(c, name, "the folder's .metadata");
            bytes = checked;
            where = c.path() + " blob '" + name + "'";
          } else {
            std::string file = InFolder(dir, s->relative_path);
            auto& f = distcp[file];
            if (!f) f = OpenMappedFile(file, "a DCP .distcp shard");
            if (s->file_offset > f->size() || s->length > f->size() - s->file_offset)
              throw Error(ErrorKind::kCorrupt, file + ": the item lies past the end of the file");
            checked = f->CopyView({f->data() + s->file_offset, s->length});
            bytes = checked;
            where = file + " bytes [" + std::to_string(s->file_offset) + ", " + std::to_string(s->file_offset + s->length) + ")";
            report.distcp_pieces++;
          }
        }
        dcp::VetTorchSaveBytes(bytes, where, checkpoint::PickleReadOptions{pickle::GlobalPolicy::kDenyListOnly, {}});
      });
      report.bytes_items++;
      continue;
    }
    for (const pickle::DcpChunk& chunk : item.chunks) {
      const pickle::DcpStorage* s = md.FindStorage(item.fqn, chunk.offsets);
      if (!s) {
        report.problems.push_back(
            Problem(ErrorKind::kCorrupt, what + ": no storage entry for the piece at " + dcp::Dims(chunk.offsets), item_place));
        continue;
      }
      check(what, item_place, [&] {
        dcp::PieceLocation loc = dcp::LocatePiece(dir, *s, open);
        ErrorPlace place;
        place.file = loc.file;
        place.tensors = {loc.container ? loc.tensor : item.fqn};
        if (loc.container) {
          const Container& c = open(loc.file);
          auto t = c.FindTensor(loc.tensor);
          if (!t) throw Error(ErrorKind::kCorrupt, c.path() + ": no tensor '" + loc.tensor + "' (the piece of '" + item.fqn + "')");
          TensorInfo info = c.tensor(*t);
          if (auto why = dcp::PieceMismatch(item, *s, info.dtype, info.shape))
            throw Error(ErrorKind::kCorrupt, c.path() + ": tensor '" + loc.tensor + "': " + *why, place);
        } else {
          auto& f = distcp[loc.file];
          if (!f) f = OpenMappedFile(loc.file, "a DCP .distcp shard");
          dcp::DistcpTensor t = dcp::ReadDistcpTensor(f, loc.offset, loc.length);
          report.distcp_pieces++;
          if (auto why = dcp::PieceMismatch(item, *s, t.view.dtype, t.view.shape))
            throw Error(ErrorKind::kCorrupt, loc.file + ": " + *why, place);
        }
      });
      report.tensors++;
    }
  }
  // Every container in full, progress counted over all of them.
  uint64_t total = 0, before = 0;
  for (auto& [path, c] : containers)
    if (c) total += c->file_bytes();
  VerifyOptions vo = options;
  if (options.progress) vo.progress = [&](uint64_t done, uint64_t) { options.progress(before + done, total); };
  for (auto& [path, c] : containers) {
    if (!c) continue;
    VerifyReport r = c->Verify(vo);
    for (VerifyProblem& p : r.problems) report.problems.push_back(std::move(p));
    report.bytes_checked += r.bytes_checked;
    report.containers++;
    before += c->file_bytes();
  }
  return report;
}


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
    DcpVerifyReport report = VerifyDcpFolder(dir, ContainerOptions(options));
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
  uint8_t head[sizeof format::kSuperblockMagic];
  if (size < sizeof head) return false;
  if (IsRemote(path)) {
    try {
      OpenFile(path)->ReadAt(0, sizeof head, head);
    } catch (const Error&) {
      return true;  // one that cannot be read is reported by its verify, not passed over
    }
  } else {
    struct stat st;
    FileDescriptor fd;
    try {
      fd = OpenRegularFile(path, &st);  // a FIFO or device node in the folder is not opened
    } catch (const Error&) {
      return false;
    }
    if (::read(fd.get(), head, sizeof head) != static_cast<ssize_t>(sizeof head)) return false;
  }
  return std::memcmp(head, format::kSuperblockMagic, sizeof head) == 0;
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
