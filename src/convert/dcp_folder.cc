// Converting and exporting DCP folders (include/zckpt/dcp.h, layouts in dcp_layout.h).
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "checkpoint/dcp_layout.h"
#include "checkpoint/folder.h"
#include "checkpoint/source_kind.h"
#include "checkpoint/storage_stream.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/dcp.h"
#include "zckpt/error.h"

namespace zckpt {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kPieceBytes = 16ull << 20;  // read and written at a time

// One .distcp file -> one container.
class DistcpConverter {
 public:
  DistcpConverter(const pickle::DcpMetadata& md, const ConvertOptions& options, DcpConvertStats& stats)
      : md_(md), options_(options), stats_(stats) {}

  void Run(const std::string& source, const std::string& name, std::vector<const pickle::DcpStorage*> entries,
           const std::string& destination) {
    auto file = std::make_shared<const MappedFile>(source);
    file->AdviseSequential(0, file->size());
    std::sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->file_offset < b->file_offset; });
    ContainerWriter w(destination, options_.writer);
    std::set<std::string> names;
    uint64_t pos = 0;
    auto gap_to = [&](uint64_t end) {
      if (end > pos) w.AddBlob(std::string(dcp::kGapBlob) + std::to_string(pos), file->CopyView({file->data() + pos, end - pos}));
    };
    for (const pickle::DcpStorage* e : entries) {
      std::string range = source + " bytes [" + std::to_string(e->file_offset) + ", " +
                          std::to_string(e->file_offset + e->length) + ")";
      if (e->file_offset < pos)
        throw Error(ErrorKind::kCorrupt, range + " (the piece of '" + e->fqn + "') overlaps the item before it");
      if (e->file_offset > file->size() || e->length > file->size() - e->file_offset)
        throw Error(ErrorKind::kCorrupt, range + " (the piece of '" + e->fqn + "') lies past the end of the " +
                                             std::to_string(file->size()) + "-byte file");
      if (e->transformed)
        throw Error(ErrorKind::kUnsupported, range + ": written through DCP stream transforms (an extension such as "
                                                     "compression): not supported");
      const pickle::DcpItem* item = md_.FindItem(e->fqn);
      if (!item) throw Error(ErrorKind::kCorrupt, range + ": '" + e->fqn + "' is not in the metadata's state_dict_metadata");
      gap_to(e->file_offset);
      const std::string at = std::to_string(e->file_offset);
      if (item->is_tensor) {
        dcp::DistcpTensor t = dcp::ReadDistcpTensor(file, e->file_offset, e->length);
        if (auto why = dcp::PieceMismatch(*item, *e, t.view.dtype, t.view.shape))
          throw Error(ErrorKind::kCorrupt, range + ": " + *why);
        w.AddBlob(std::string(dcp::kHeadBlob) + at,
                  file->CopyView({file->data() + e->file_offset, t.storage_begin - e->file_offset}));
        uint32_t storage = w.BeginStorage(NewStorage{at, t.storage.location, t.storage.dtype, t.storage.untyped},
                                          t.storage_end - t.storage_begin);
        for (uint64_t off = t.storage_begin; off < t.storage_end; off += kPieceBytes) {
          if (options_.cancel && options_.cancel->load()) throw Error(ErrorKind::kCancelled, "conversion cancelled");
          uint64_t n = std::min(kPieceBytes, t.storage_end - off);
          piece_.resize(std::max<uint64_t>(piece_.size(), n));
          file->ReadAt(off, n, piece_.data());  // pread: a file that shrank is Error(kIo) naming it
          w.AppendStorage({piece_.data(), n});
          if (options_.progress) options_.progress(done_ + off + n, total_);
        }
        w.EndStorage();
        w.AddBlob(std::string(dcp::kTailBlob) + at,
                  file->CopyView({file->data() + t.storage_end, e->file_offset + e->length - t.storage_end}));
        std::string tensor_name = dcp::PieceName(e->fqn, e->offset);
        for (int k = 1; !names.insert(tensor_name).second; ++k) tensor_name = dcp::PieceName(e->fqn, e->offset) + "#" + std::to_string(k);
        const pickle::DcpChunk* chunk = dcp::ChunkAt(*item, e->offset);
        NewTensor nt;
        nt.name = tensor_name;
        nt.storage = storage;
        nt.dtype = t.view.dtype;
        nt.shape = t.view.shape;
        nt.stride = t.view.stride;
        if (t.view.storage_offset < 0) throw Error(ErrorKind::kCorrupt, range + ": negative storage offset");
        nt.storage_offset = static_cast<uint64_t>(t.view.storage_offset);
        nt.flags = checkpoint::IndexFlags(t.view);
        nt.extra = dcp::PieceExtra(e->fqn, item->size, chunk->offsets, chunk->sizes);
        w.AddTensor(nt);
        ++stats_.tensors;
      } else {
        // One private read: the bytes kept are the bytes vetted.
        std::vector<uint8_t> bytes = file->CopyView({file->data() + e->file_offset, e->length});
        checkpoint::PickleReadOptions read;  // DCP's planner will unpickle it: the allowlist
        read.allow_globals = options_.allow_globals;
        dcp::VetTorchSaveBytes(bytes, range + " (the item '" + e->fqn + "')", read);
        w.AddBlob(std::string(dcp::kBytesAtBlob) + at, bytes);
        ++stats_.bytes_items;
      }
      pos = e->file_offset + e->length;
    }
    gap_to(file->size());
    w.SetMetadata(std::string(dcp::kKeySourceName), name);
    w.SetMetadata(std::string(dcp::kKeySourceBytes), std::to_string(file->size()));
    WriterStats ws = w.Commit();
    done_ += file->size();  // progress counts source bytes, whole files once written
    if (options_.progress) options_.progress(done_, total_);
    stats_.files++;
    stats_.source_bytes += file->size();
    stats_.written_bytes += ws.file_bytes;
  }

  void SetTotal(uint64_t total) { total_ = total; }

 private:
  const pickle::DcpMetadata& md_;
  const ConvertOptions& options_;
  DcpConvertStats& stats_;
  uint64_t done_ = 0, total_ = 0;  // bytes of the .distcp files converted, of all of them
  std::vector<uint8_t> piece_;      // a storage's bytes on their way to the writer
};

// The files directly in `dir` (a local folder or an object folder), by name; writers' temporaries left out.
std::vector<std::string> FileNames(const std::string& dir) {
  std::vector<std::string> out;
  for (checkpoint::FolderFile& f : checkpoint::FolderFiles(dir, /*recursive=*/false)) out.push_back(std::move(f.name));
  return out;
}

// A byte offset written in decimal in a storage key or blob name of a converted container.
uint64_t OffsetIn(const Container& c, std::string_view text) {
  uint64_t v = 0;
  if (text.empty() || text.size() > 19) throw Error(ErrorKind::kCorrupt, c.path() + ": '" + std::string(text) + "' is not a byte offset");
  for (char ch : text) {
    if (ch < '0' || ch > '9') throw Error(ErrorKind::kCorrupt, c.path() + ": '" + std::string(text) + "' is not a byte offset");
    v = v * 10 + static_cast<uint64_t>(ch - '0');
  }
  return v;
}

// What ConvertDcpFolder does with each file of the folder: the entries of each `.distcp` file the
// metadata names (that file becomes a container), and the other files (copied). The pointers
// point into `md`.
struct ConvertPlan {
  std::map<std::string, std::vector<const pickle::DcpStorage*>> by_file;
  std::vector<std::string> copied;
};

ConvertPlan PlanConvert(const std::string& source, const pickle::DcpMetadata& md) {
  ConvertPlan plan;
  for (const pickle::DcpStorage& s : md.storage) {
    if (!s.file_slice)
      throw Error(ErrorKind::kInvalidArgument, source + ": already zckpt's DCP layout (written by ZckptStorageWriter)");
    plan.by_file[s.relative_path].push_back(&s);
  }
  for (const std::string& name : FileNames(source))
    if (!plan.by_file.count(name)) plan.copied.push_back(name);
  return plan;
}

std::string ContainerName(const std::string& distcp) {
  return (dcp::EndsWith(distcp, dcp::kDistcpSuffix) ? distcp.substr(0, distcp.size() - dcp::kDistcpSuffix.size()) : distcp) +
         std::string(dcp::kContainerSuffix);
}

// What ExportDcpFolder writes: each container converted from a `.distcp` file (opened, its
// original name checked), and the other files (copied).
struct ExportPlan {
  std::vector<std::unique_ptr<Container>> containers;
  std::vector<std::string> copied;
};

// The containers of `source` and what to copy; `allow_globals`: every BytesIO item is vetted
// under the allowlist plus these before anything is written (DCP's planner unpickles them).
ExportPlan PlanExport(const std::string& source, const std::vector<std::string>* allow_globals) {
  (void)dcp::ReadFolderMetadata(source);  // a folder whose metadata zckpt cannot read is not exported
  ExportPlan plan;
  std::set<std::string> outputs;
  for (const std::string& name : FileNames(source)) {
    if (!dcp::EndsWith(name, dcp::kContainerSuffix)) {
      plan.copied.push_back(name);
      continue;
    }
    auto c = Container::Open(checkpoint::InFolder(source, name));
    auto original = c->FindMetadata(dcp::kKeySourceName);
    if (!original)
      throw Error(ErrorKind::kInvalidArgument,
                  c->path() + ": written by zckpt.dcp.ZckptStorageWriter, not converted from a .distcp file: there is "
                              "no FileSystemWriter layout to give back (read the folder with ZckptStorageReader)");
    std::string out(*original);
    if (out.empty() || out.find('/') != std::string::npos || out == "." || out == ".." || !outputs.insert(out).second)
      throw Error(ErrorKind::kCorrupt, c->path() + ": metadata '" + std::string(dcp::kKeySourceName) + "' = '" + out +
                                           "' is not a file name of its own");
    if (allow_globals) {
      checkpoint::PickleReadOptions read;
      read.allow_globals = *allow_globals;
      for (uint32_t b = 0; b < c->blob_count(); ++b) {
        std::string blob(c->blob(b).name);
        if (blob.rfind(dcp::kBytesAtBlob, 0) == 0)
          dcp::VetTorchSaveBytes(c->CheckedBlobBytes(c->blob(b)), c->path() + " blob '" + blob + "'", read);
      }
    }
    plan.containers.push_back(std::move(c));
  }
  return plan;
}

void CreateFolder(const std::string& dir) {
  if (checkpoint::IsRemote(dir)) return;  // an object folder is only its keys' common prefix
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, dir + ": cannot create the folder: " + ec.message());
}

}  // namespace

bool IsDcpFolder(const std::string& dir) { return checkpoint::IsDcpFolder(dir); }

std::vector<std::string> DcpConvertOutputs(const std::string& source, const std::string& destination) {
  pickle::DcpMetadata md = dcp::ReadFolderMetadata(source);
  ConvertPlan plan = PlanConvert(source, md);
  std::vector<std::string> out;
  for (const auto& [name, entries] : plan.by_file) out.push_back(checkpoint::InFolder(destination, ContainerName(name)));
  for (const std::string& name : plan.copied) out.push_back(checkpoint::InFolder(destination, name));
  return out;
}

DcpConvertStats ConvertDcpFolder(const std::string& source, const std::string& destination, const ConvertOptions& options) {
  pickle::DcpMetadata md = dcp::ReadFolderMetadata(source);
  ConvertPlan plan = PlanConvert(source, md);
  DcpConvertStats stats;
  DistcpConverter converter(md, options, stats);
  uint64_t total = 0;
  for (const auto& [name, entries] : plan.by_file) {
    struct stat st;
    std::string path = source + "/" + name;
    if (::stat(path.c_str(), &st) != 0) throw Error(ErrorKind::kCorrupt, path + ": missing (the metadata lists pieces in it)");
    total += static_cast<uint64_t>(st.st_size);
  }
  CreateFolder(destination);
  converter.SetTotal(total);
  for (const auto& [name, entries] : plan.by_file)
    converter.Run(source + "/" + name, name, entries, checkpoint::InFolder(destination, ContainerName(name)));
  for (const std::string& name : plan.copied) {
    checkpoint::CopyFileTo(checkpoint::InFolder(source, name), checkpoint::InFolder(destination, name));
    stats.copied++;
  }
  return stats;
}

std::vector<std::string> DcpExportOutputs(const std::string& source, const std::string& destination) {
  ExportPlan plan = PlanExport(source, nullptr);
  std::vector<std::string> out;
  for (const auto& c : plan.containers) out.push_back(checkpoint::InFolder(destination, std::string(*c->FindMetadata(dcp::kKeySourceName))));
  for (const std::string& name : plan.copied) out.push_back(checkpoint::InFolder(destination, name));
  return out;
}

void ExportDcpFolder(const std::string& source, const std::string& destination,
                     const std::vector<std::string>& allow_globals) {
  ExportPlan plan = PlanExport(source, &allow_globals);
  CreateFolder(destination);
  for (const auto& c : plan.containers) {
    // Every piece of the original file by its offset: storages keyed by offset (with their head
    // and tail blobs), BytesIO items and gaps; they must tile the file exactly.
    struct Part {
      uint64_t offset = 0;
      std::string blob;                   // a whole blob
      std::optional<uint32_t> storage;    // or head + storage + tail
    };
    std::vector<Part> parts;
    for (uint32_t s = 0; s < c->storage_count(); ++s) parts.push_back(Part{OffsetIn(*c, c->storage(s).key), "", s});
    for (uint32_t b = 0; b < c->blob_count(); ++b) {
      std::string name(c->blob(b).name);
      for (std::string_view prefix : {dcp::kBytesAtBlob, dcp::kGapBlob})
        if (name.rfind(prefix, 0) == 0)
          parts.push_back(Part{OffsetIn(*c, std::string_view(name).substr(prefix.size())), name, std::nullopt});
    }
    std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.offset < b.offset; });
    const std::string out = checkpoint::InFolder(destination, std::string(*c->FindMetadata(dcp::kKeySourceName)));
    AtomicFile f(out);
    auto blob = [&](const std::string& name) { return checkpoint::CheckedBlob(*c, name, "the converted .distcp layout"); };
    for (const Part& p : parts) {
      if (p.offset != f.position())
        throw Error(ErrorKind::kCorrupt, c->path() + ": the pieces do not tile the original file: one starts at byte " +
                                             std::to_string(p.offset) + ", the bytes before it end at " + std::to_string(f.position()));
      if (!p.storage) {
        auto bytes = blob(p.blob);
        f.Write(bytes.data(), bytes.size());
        continue;
      }
      std::string at = std::to_string(p.offset);
      auto head = blob(std::string(dcp::kHeadBlob) + at);
      f.Write(head.data(), head.size());
      checkpoint::StreamStorage(*c, *p.storage, [&](std::span<const uint8_t> piece) { f.Write(piece.data(), piece.size()); });
      auto tail = blob(std::string(dcp::kTailBlob) + at);
      f.Write(tail.data(), tail.size());
    }
    auto size = c->FindMetadata(dcp::kKeySourceBytes);
    if (!size || std::to_string(f.position()) != *size)
      throw Error(ErrorKind::kCorrupt, c->path() + ": the pieces end at byte " + std::to_string(f.position()) +
                                           ", the original file had " + (size ? std::string(*size) : "no recorded size"));
    f.Commit();
  }
  for (const std::string& name : plan.copied) checkpoint::CopyFileTo(checkpoint::InFolder(source, name), checkpoint::InFolder(destination, name));
}

}  // namespace zckpt
