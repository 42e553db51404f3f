// Placement metadata -> pieces. Three sources:
//   DCP folders: `.metadata` lists every tensor's chunks (offsets, sizes) and where each is.
//   verl files holding ShardedTensor local shards (FSDP1): each record's extra JSON gives the
//     shard's offsets and sizes in the global tensor.
//   verl files holding DTensor local tensors (FSDP2): the extra JSON gives the global shape, the
//     placements and the mesh shape; the piece's place follows from the file's rank as torch's
//     compute_local_shape_and_global_offset computes it (Shard: torch.chunk's split, applied mesh
//     dimension by mesh dimension). The mesh's own rank list (the DeviceMesh tensor the file
//     carries) must be 0..W-1 in order, else the rank's coordinate is not its index.
// Plain tensors in verl files are replicas of the whole tensor.
#include "merge/layouts.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/mapped_file.h"
#include "checkpoint/dcp_layout.h"
#include "checkpoint/folder.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/source_kind.h"
#include "merge/assemble.h"
#include "merge/fsdp1_flat.h"
#include "merge/verl_files.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "pt/pt_archive.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::merge {

using json = nlohmann::json;

namespace {

std::vector<int64_t> IntList(const json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) throw Error(ErrorKind::kCorrupt, what + ": its placement metadata has no '" + key + "'");
  std::vector<int64_t> out;
  for (const json& v : *it) {
    if (!v.is_number_integer()) throw Error(ErrorKind::kCorrupt, what + ": '" + key + "' holds a non-integer");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

json ParseExtra(const std::string& extra, const std::string& what) {
  json j = json::parse(extra, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw Error(ErrorKind::kCorrupt, what + ": its placement metadata is not a JSON object");
  return j;
}

SavedView ContainerView(const Container& c, const TensorInfo& t) {
  SavedView v;
  v.what = c.path() + ": tensor '" + std::string(t.name) + "'";
  v.container = &c;
  v.storage = t.storage;
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.stride = t.stride;
  v.storage_offset = t.storage_offset;
  return v;
}

// A rank's file saved as another rank's (a copy or a rename) would put its shards in the wrong
// place while tiling perfectly, so the name torch.save recorded (the archive's record prefix is
// the file's stem) must agree with the file's.
void CheckSavedAs(const std::string& path, std::string_view saved, const std::string& files, int64_t world, int64_t rank) {
  std::string expected = files + "_world_size_" + std::to_string(world) + "_rank_" + std::to_string(rank);
  static const std::regex pattern("^.+_world_size_[0-9]+_rank_[0-9]+$");
  std::string s(saved);
  if (std::regex_match(s, pattern) && s != expected)
    throw Error(ErrorKind::kCorrupt, path + ": saved as " + s + ", not " + expected + " (a renamed or copied rank file)");
}

// Container tensor records.
std::vector<Record> ContainerRecords(const Container& c) {
  std::vector<Record> out;
  for (uint32_t i = 0; i < c.tensor_count(); ++i) {
    TensorInfo t = c.tensor(i);
    out.push_back(Record{std::string(t.name), t.flags, std::string(t.extra), ContainerView(c, t)});
  }
  return out;
}

// How a rank file's pickle is read: the merge gives back the tensors it describes, so under the
// allowlist plus the caller's names, as convert reads one.
checkpoint::PickleReadOptions PickleRead(const MergeOptions& options) {
  checkpoint::PickleReadOptions read;
  read.allow_globals = options.allow_globals;
  return read;
}

// .pt tensor records: zckpt's interpreter over data.pkl, storages as byte ranges of the mapping.
std::vector<Record> ArchiveRecords(const std::shared_ptr<const MappedFile>& file, std::string* saved_as,
                                   const checkpoint::PickleReadOptions& read) {
  pt::TorchArchive archive(file);
  *saved_as = archive.prefix();
  pickle::UnpickleResult tree = pickle::Unpickle(archive.RecordCopy("data.pkl"), read.Unpickle());
  pickle::TorchPickle model = pickle::InterpretTorchPickle(tree);
  std::vector<Record> out;
  for (const pickle::TorchTensor& t : model.tensors) {
    const pickle::TorchStorage& s = model.storages[t.storage];
    const pt::TorchRecord* rec = archive.FindRecord("data/" + s.key);
    if (!rec) throw Error(ErrorKind::kCorrupt, file->path() + ": no record data/" + s.key + " (tensor '" + t.name + "')");
    std::span<const uint8_t> bytes = archive.Record(rec->name);
    Record r;
    r.name = t.name;
    r.flags = (t.dtensor_local ? format::kTensorDTensorLocal : 0) | (t.sharded_local ? format::kTensorShardedLocal : 0) |
              (t.quantized ? format::kTensorQuantized : 0) | (t.internal ? format::kTensorInternal : 0) |
              (t.conj ? format::kTensorConj : 0) | (t.neg ? format::kTensorNeg : 0);
    r.extra = t.extra;
    r.view.what = file->path() + ": tensor '" + t.name + "'";
    r.view.file = file.get();
    r.view.bytes = bytes.data();
    r.view.bytes_size = bytes.size();
    r.view.crc32 = rec->entry->crc32;
    r.view.dtype = t.dtype;
    r.view.shape = t.shape;
    r.view.stride = t.stride;
    if (t.storage_offset < 0) throw Error(ErrorKind::kCorrupt, r.view.what + ": negative storage offset");
    r.view.storage_offset = static_cast<uint64_t>(t.storage_offset);
    out.push_back(std::move(r));
  }
  return out;
}

bool IsMeshTensor(const Record& r) {
  return dcp::EndsWith(r.name, "._spec.mesh.mesh") || dcp::EndsWith(r.name, "._spec.mesh._rank_map");
}

// The rank list of the DTensor mesh a file carries must be 0..W-1 in order (then a rank's mesh
// coordinate is its index unravelled over the mesh shape).
void CheckMeshRanks(const std::vector<Record>& records, int64_t world, const std::string& file, Assembler& assembler) {
  for (const Record& r : records) {
    if (!IsMeshTensor(r)) continue;
    const SavedView& v = r.view;
    if (v.dtype != DType::kInt64 && v.dtype != DType::kInt32)
      throw Error(ErrorKind::kCorrupt, v.what + ": a DeviceMesh rank tensor of dtype " + std::string(DTypeName(v.dtype)));
    uint64_t n = 1;
    for (int64_t s : v.shape) n *= static_cast<uint64_t>(s);
    if (n > (1u << 24)) throw Error(ErrorKind::kCorrupt, v.what + ": a DeviceMesh of " + std::to_string(n) + " ranks");
    std::vector<uint8_t> bytes(n * DTypeSize(v.dtype));
    assembler.Read(v, bytes.data());
    bool identity = n == static_cast<uint64_t>(world);
    for (uint64_t i = 0; identity && i < n; ++i) {
      int64_t rank = 0;
      if (v.dtype == DType::kInt64) std::memcpy(&rank, bytes.data() + 8 * i, 8);
      else {
        int32_t r32;
        std::memcpy(&r32, bytes.data() + 4 * i, 4);
        rank = r32;
      }
      identity = rank == static_cast<int64_t>(i);
    }
    if (!identity)
      throw Error(ErrorKind::kUnsupported, file + ": the DTensors' DeviceMesh (" + v.what + ") is not ranks 0.." +
                                               std::to_string(world - 1) + " in order (a sub-mesh, or ranks "
                                               "permuted): merging it is not supported");
  }
}

// The piece a DTensor local tensor of rank `rank` is (torch's compute_local_shape_and_global_offset
// for Shard and Replicate placements).
Piece DTensorPiece(const Record& r, int64_t rank, int64_t world, std::vector<int64_t>* global) {
  const std::string& what = r.view.what;
  json j = ParseExtra(r.extra, what);
  *global = IntList(j, "global_shape", what);
  std::vector<int64_t> mesh = IntList(j, "mesh_shape", what);
  auto placements = j.find("placements");
  if (placements == j.end() || !placements->is_array() || placements->size() != mesh.size())
    throw Error(ErrorKind::kCorrupt, what + ": its placements do not match its mesh shape");
  int64_t ranks = 1;
  for (int64_t m : mesh) {
    if (m <= 0) throw Error(ErrorKind::kCorrupt, what + ": mesh shape holds " + std::to_string(m));
    ranks *= m;
  }
  if (ranks != world)
    throw Error(ErrorKind::kUnsupported, what + ": a DTensor on a mesh of " + std::to_string(ranks) + " ranks in a " +
                                             std::to_string(world) + "-rank checkpoint (a sub-mesh): not supported");
  std::vector<int64_t> coord(mesh.size());
  for (size_t i = mesh.size(), rest = static_cast<size_t>(rank); i-- > 0;) {
    coord[i] = static_cast<int64_t>(rest % static_cast<size_t>(mesh[i]));
    rest /= static_cast<size_t>(mesh[i]);
  }
  std::vector<int64_t> local = *global, offset(global->size(), 0);
  for (size_t i = 0; i < mesh.size(); ++i) {
    const json& p = (*placements)[i];
    std::string type = p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>() : "?";
    if (type == "Replicate") continue;
    if (type != "Shard")
      throw Error(ErrorKind::kUnsupported, what + ": placement " + type + " on mesh dimension " + std::to_string(i) +
                                               (type.find("Partial") != std::string::npos
                                                    ? " holds partial values that need a reduction"
                                                    : " is not supported (Shard and Replicate are)"));
    if (!p.contains("dim") || !p["dim"].is_number_integer())
      throw Error(ErrorKind::kCorrupt, what + ": a Shard placement without a dim");
    int64_t d = p["dim"].get<int64_t>();
    if (d < 0 || d >= static_cast<int64_t>(local.size()))
      throw Error(ErrorKind::kCorrupt, what + ": Shard(" + std::to_string(d) + ") of a " + std::to_string(local.size()) + "-d tensor");
    int64_t cur = local[d], n = mesh[i];
    int64_t full = (cur + n - 1) / n;
    int64_t start = std::min(full * coord[i], cur);
    int64_t size = std::max<int64_t>(0, std::min(cur, start + full) - start);
    offset[d] += start;
    local[d] = size;
  }
  if (local != r.view.shape) {
    std::string s = "[", l = "[";
    for (size_t i = 0; i < local.size(); ++i) l += (i ? ", " : "") + std::to_string(local[i]);
    for (size_t i = 0; i < r.view.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(r.view.shape[i]);
    throw Error(ErrorKind::kCorrupt, what + ": rank " + std::to_string(rank) + "'s local tensor has shape " + s +
                                         "], its placements give " + l + "]");
  }
  return Piece{r.view, offset, {}};
}

Piece ShardPiece(const Record& r, int64_t rank, std::vector<int64_t>* global) {
  const std::string& what = r.view.what;
  json j = ParseExtra(r.extra, what);
  // "rank:R/cuda:0": the shard's own record of whose it is.
  if (auto p = j.find("placement"); p != j.end() && p->is_string()) {
    std::string placement = p->get<std::string>(), expected = "rank:" + std::to_string(rank) + "/";
    if (placement.rfind("rank:", 0) == 0 && placement.rfind(expected, 0) != 0)
      throw Error(ErrorKind::kCorrupt, what + ": a shard placed on " + placement + " in rank " + std::to_string(rank) + "'s file");
  }
  *global = IntList(j, "global_shape", what);
  std::vector<int64_t> offsets = IntList(j, "shard_offsets", what), sizes = IntList(j, "shard_sizes", what);
  if (sizes != r.view.shape) throw Error(ErrorKind::kCorrupt, what + ": its shard sizes differ from its shape");
  return Piece{r.view, offsets, {}};
}

// Adds a piece to the tensor `name`, creating it (in first-seen order) when new.
void AddPiece(Checkpoint& ck, std::map<std::string, size_t>& index, const std::string& name, DType dtype,
              const std::vector<int64_t>& global, Piece piece) {
  auto [it, fresh] = index.emplace(name, ck.tensors.size());
  if (fresh) ck.tensors.push_back(FullTensor{name, dtype, global, {}});
  FullTensor& t = ck.tensors[it->second];
  if (t.shape != global)
    throw Error(ErrorKind::kCorrupt, piece.view.what + ": says tensor '" + name + "' has another global shape than its other pieces");
  t.pieces.push_back(std::move(piece));
}

const std::regex& RankFilePattern() {
  static const std::regex pattern("^(.+)_world_size_([0-9]+)_rank_([0-9]+)\\.(zckpt|pt)$");
  return pattern;
}

// The pieces of a family of verl files whose tensors are DTensor / ShardedTensor local shards
// (their metadata places them) or plain tensors (every rank holds all of it: replicas).
void AddPlacedPieces(const VerlFamily& fam, const MergeOptions& options, Checkpoint& ck,
                     std::map<std::string, size_t>& index) {
  for (int64_t rank = 0; rank < fam.world; ++rank) {
    for (const Record& r : fam.ranks[rank]) {
      if ((r.flags & format::kTensorInternal) || IsMeshTensor(r)) continue;
      if (r.flags & format::kTensorQuantized)
        throw Error(ErrorKind::kUnsupported, r.view.what + ": quantized tensors cannot be merged");
      if (r.flags & (format::kTensorConj | format::kTensorNeg))
        throw Error(ErrorKind::kUnsupported, r.view.what + ": a conj/neg view cannot be merged");
      std::string name = r.name;
      std::vector<int64_t> global;
      Piece piece;
      if (r.flags & format::kTensorDTensorLocal) {
        piece = DTensorPiece(r, rank, fam.world, &global);
      } else if (r.flags & format::kTensorShardedLocal) {
        piece = ShardPiece(r, rank, &global);
        name = ShardedTensorName(name);
      } else {
        global = r.view.shape;  // a plain tensor: every rank holds all of it
        piece = Piece{r.view, std::vector<int64_t>(global.size(), 0), {}};
      }
      if (!SelectName(options.keys, &name)) continue;
      AddPiece(ck, index, name, r.view.dtype, global, std::move(piece));
    }
  }
}

Checkpoint DiscoverVerl(const std::string& dir, const MergeOptions& options) {
  Checkpoint ck;
  VerlFamily fam = ReadVerlFamily(dir, options.files, options, ck);
  ck.layout = "verl (" + std::to_string(fam.world) + " ranks)";
  std::map<std::string, size_t> index;
  if (std::optional<Fsdp1Layout> layout = FindFsdp1Layout(dir, fam, options, ck)) {
    // FSDP1's optimizer.state_dict(): rank-local FlatParameter shards as plain tensors, placed
    // by the FlatParameter layout the model files give (fsdp1_flat.h).
    AddFlatOptimPieces(*layout, fam, options, ck);
    ck.layout = "verl FSDP1 flat optimizer state (" + std::to_string(fam.world) + " ranks, " +
                std::to_string(layout->flat_params.size()) + " FlatParameters)";
  } else {
    AddPlacedPieces(fam, options, ck, index);
  }
  std::string hf = checkpoint::InFolder(dir, "huggingface");
  if (checkpoint::IsFolder(hf)) ck.huggingface_dir = hf;
  return ck;
}

Checkpoint DiscoverDcp(const std::string& dir, const MergeOptions& options) {
  pickle::DcpMetadata md = dcp::ReadFolderMetadata(dir);
  Checkpoint ck;
  std::map<std::string, const Container*> open;
  std::map<std::string, std::shared_ptr<const MappedFile>> mapped;
  auto container = [&](const std::string& path) -> const Container& {
    auto& c = open[path];
    if (!c) {
      ck.containers.push_back(Container::Open(path));
      c = ck.containers.back().get();
    }
    return *c;
  };
  bool any_distcp = false;
  for (const pickle::DcpItem& item : md.items) {
    std::string name = item.fqn;
    if (!item.is_tensor || !SelectName(options.keys, &name)) continue;
    FullTensor t{name, item.dtype, item.size, {}};
    for (const pickle::DcpChunk& chunk : item.chunks) {
      const pickle::DcpStorage* s = md.FindStorage(item.fqn, chunk.offsets);
      if (!s) throw Error(ErrorKind::kCorrupt, dir + ": '" + item.fqn + "' has no storage entry for its chunk at offsets");
      dcp::PieceLocation loc = dcp::LocatePiece(dir, *s, container);
      Piece p;
      p.offsets = chunk.offsets;
      if (loc.container) {
        const Container& c = container(loc.file);
        auto i = c.FindTensor(loc.tensor);
        if (!i) throw Error(ErrorKind::kCorrupt, c.path() + ": no tensor '" + loc.tensor + "' (a piece of '" + item.fqn + "')");
        p.view = ContainerView(c, c.tensor(*i));
      } else {
        any_distcp = true;
        auto& f = mapped[loc.file];
        if (!f) {
          f = checkpoint::OpenMappedFile(loc.file, "a DCP .distcp shard");
          ck.files.push_back(f);
        }
        dcp::DistcpTensor d = dcp::ReadDistcpTensor(f, loc.offset, loc.length);
        p.view.what = loc.file + " bytes [" + std::to_string(loc.offset) + ", " + std::to_string(loc.offset + loc.length) +
                      ") ('" + item.fqn + "')";
        p.view.file = f.get();
        p.view.bytes = f->data() + d.storage_begin;
        p.view.bytes_size = d.storage_end - d.storage_begin;
        p.view.crc32 = d.crc32;
        p.view.dtype = d.view.dtype;
        p.view.shape = d.view.shape;
        p.view.stride = d.view.stride;
        if (d.view.storage_offset < 0) throw Error(ErrorKind::kCorrupt, p.view.what + ": negative storage offset");
        p.view.storage_offset = static_cast<uint64_t>(d.view.storage_offset);
      }
      if (p.view.shape != chunk.sizes)
        throw Error(ErrorKind::kCorrupt, p.view.what + ": its shape differs from the metadata's chunk of '" + item.fqn + "'");
      t.pieces.push_back(std::move(p));
    }
    ck.tensors.push_back(std::move(t));
  }
  ck.layout = any_distcp ? "DCP (FileSystemWriter)" : "DCP (zckpt)";
  std::string hf = checkpoint::InFolder(dir, "huggingface");
  if (checkpoint::IsFolder(hf)) ck.huggingface_dir = hf;
  return ck;
}

}  // namespace

std::string ShardedTensorName(const std::string& record_name) {
  static const std::regex local_shard("^(.*)\\.local_shards\\.[0-9]+$");
  std::smatch m;
  return std::regex_match(record_name, m, local_shard) ? std::string(m[1]) : record_name;
}

std::vector<int64_t> ShardedGlobalShape(const Record& r) {
  return IntList(ParseExtra(r.extra, r.view.what), "global_shape", r.view.what);
}

bool HasVerlFamily(const std::string& dir, const std::string& family) {
  std::vector<checkpoint::FolderFile> files;
  try {
    files = checkpoint::FolderFiles(dir, /*recursive=*/false);
  } catch (const Error&) {
    return false;
  }
  for (const checkpoint::FolderFile& f : files) {
    std::smatch m;
    if (std::regex_match(f.name, m, RankFilePattern()) && m[1] == family) return true;
  }
  return false;
}

VerlFamily ReadVerlFamily(const std::string& dir, const std::string& family, const MergeOptions& options,
                          Checkpoint& ck) {
  // rank -> file (a .zckpt preferred to a .pt of the same rank)
  std::map<int64_t, std::string> files;
  int64_t world = -1;
  for (const checkpoint::FolderFile& f : checkpoint::FolderFiles(dir, /*recursive=*/false)) {
    const std::string& name = f.name;
    std::smatch m;
    if (!std::regex_match(name, m, RankFilePattern()) || m[1] != family) continue;
    if (m[2].length() > 9 || m[3].length() > 9) continue;
    int64_t w = std::stoll(m[2]), r = std::stoll(m[3]);
    if (world >= 0 && w != world)
      throw Error(ErrorKind::kInvalidArgument, dir + ": files of world sizes " + std::to_string(world) + " and " +
                                                   std::to_string(w) + " side by side");
    world = w;
    if (r >= w) throw Error(ErrorKind::kInvalidArgument, dir + ": " + name + " names a rank past its world size");
    auto& slot = files[r];
    if (slot.empty() || dcp::EndsWith(name, ".zckpt")) slot = checkpoint::InFolder(dir, name);
  }
  if (world < 0)
    throw Error(ErrorKind::kInvalidArgument, dir + ": neither a DCP folder (.metadata) nor verl's per-rank files (" +
                                                 family + "_world_size_W_rank_R.zckpt or .pt)");
  for (int64_t r = 0; r < world; ++r)
    if (!files.count(r))
      throw Error(ErrorKind::kInvalidArgument, dir + ": rank " + std::to_string(r) + " of " + std::to_string(world) +
                                                   " is missing (" + family + "_world_size_" + std::to_string(world) +
                                                   "_rank_" + std::to_string(r) + ".zckpt or .pt)");
  VerlFamily fam;
  fam.family = family;
  fam.world = world;
  Assembler assembler;
  for (const auto& [rank, path] : files) {
    std::vector<Record> records;
    std::string saved_as;
    if (dcp::EndsWith(path, ".zckpt")) {
      ck.containers.push_back(Container::Open(path));
      // The index is what is merged: its pickle (what zckpt.load would give) must agree first.
      (void)checkpoint::ReadObjectPickle(*ck.containers.back(), PickleRead(options));
      records = ContainerRecords(*ck.containers.back());
      saved_as = std::string(ck.containers.back()->FindMetadata("zckpt.source.prefix").value_or(""));
    } else {
      auto file = checkpoint::OpenMappedFile(path, "a torch.save (.pt) rank file");
      ck.files.push_back(file);
      records = ArchiveRecords(file, &saved_as, PickleRead(options));
    }
    CheckSavedAs(path, saved_as, family, world, rank);
    CheckMeshRanks(records, world, path, assembler);
    fam.paths.push_back(path);
    fam.ranks.push_back(std::move(records));
  }
  return fam;
}

void CheckDcpTilingOf(const std::string& dir) {
  Checkpoint ck = DiscoverDcp(dir, MergeOptions{});
  for (FullTensor& t : ck.tensors) Tile(t);
}

Checkpoint Discover(const std::string& given, const MergeOptions& options) {
  const std::string dir = checkpoint::IsRemote(given) ? checkpoint::WithoutTrailingSlash(given) : given;
  if (!checkpoint::IsFolder(given))
    throw Error(ErrorKind::kInvalidArgument,
                dir + (checkpoint::IsRemote(dir) ? ": no objects under this prefix (check the bucket and the key prefix)"
                                                 : ": not a folder"));
  Checkpoint ck = checkpoint::IsDcpFolder(dir) ? DiscoverDcp(dir, options) : DiscoverVerl(dir, options);
  if (ck.tensors.empty())
    throw Error(ErrorKind::kInvalidArgument, dir + ": no tensors to merge" +
                                                 (options.keys.empty() ? "" : " whose names start with '" + options.keys + "'"));
  for (FullTensor& t : ck.tensors) Tile(t);
  return ck;
}

}  // namespace zckpt::merge
