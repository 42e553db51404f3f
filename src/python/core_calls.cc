// The call table, handles and replies (core_calls.h), and the calls on whole files: open and
// describe a checkpoint, its records and vetted pickle, convert, export, verify, the files the
// Python side reads and writes beside containers, object storage folders, the format's constants
// and load_into's checks of its targets against a checkpoint.
#include "python/core_calls.h"

#include <iterator>
#include <utility>

#include "checkpoint/dcp_layout.h"
#include "checkpoint/folder.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/source_kind.h"
#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "common/stale_temps.h"
#include "loader/into_check.h"
#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/format.h"
#include "zckpt/object_store.h"
#include "zckpt/verify.h"

namespace zckpt::python {

Json Reply::Bytes(std::string bytes) {
  bytes_.push_back(std::move(bytes));
  return Json{{"$bytes", bytes_.size() - 1}};
}

std::string_view AddressBytes(uint64_t address, uint64_t n) {
  if (n != 0 && address == 0) throw Error(ErrorKind::kInvalidArgument, "a null address for " + std::to_string(n) + " bytes");
  return {reinterpret_cast<const char*>(address), static_cast<size_t>(n)};
}

std::string_view ArgBytes(const Json& v) {
  return AddressBytes(v.at("$address").get<uint64_t>(), v.at("$bytes").get<uint64_t>());
}

std::shared_ptr<void> Handles::Find(uint64_t id, const std::type_info& type, const char* what, bool erase) {
  Held found;  // destroyed after the lock is let go: a destructor may take long (unmapping)
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(id);
    if (it == held_.end() || *it->second.type != type)
      throw Error(ErrorKind::kInvalidArgument, "handle " + std::to_string(id) + " is not " + what +
                                                   (it == held_.end() ? " (released, or never made)" : " (another kind)"));
    found = it->second;
    if (erase) held_.erase(it);
  }
  return erase ? nullptr : found.object;
}

Handles& TheHandles() {
  static Handles* handles = new Handles;  // never destroyed: Python may release at interpreter exit
  return *handles;
}

Json PlaceJson(const ErrorPlace& place) {
  auto text = [](const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); };
  auto range = [](const std::optional<ByteRange>& r) { return r ? Json::array({r->begin, r->end}) : Json(nullptr); };
  return Json{{"file", text(place.file)},
              {"storage", text(place.storage)},
              {"tensors", place.tensors.empty() ? Json(nullptr) : Json(place.tensors)},
              {"chunk", place.chunk < 0 ? Json(nullptr) : Json(place.chunk)},
              {"file_bytes", range(place.file_bytes)},
              {"storage_bytes", range(place.storage_bytes)}};
}

Json ProblemJson(ErrorKind kind, const std::string& message, const ErrorPlace& place) {
  Json d = PlaceJson(place);
  d["kind"] = ErrorKindName(kind);
  d["message"] = message;
  return d;
}

Json RunCall(const std::string& name, const Json& args, Reply& reply) {
  static const CallTable* calls = [] {
    auto* t = new CallTable;
    AddContainerCalls(*t);
    AddLoadCalls(*t);
    AddShardedCalls(*t);
    return t;
  }();
  auto it = calls->find(name);
  if (it == calls->end()) throw Error(ErrorKind::kInvalidArgument, "zckpt's core has no call '" + name + "'");
  return it->second(args, reply);
}

std::unique_ptr<Container> OpenContainer(const std::string& path) {
  try {
    return Container::Open(path);
  } catch (const Error& e) {
    throw checkpoint::WithNotAContainerHint(e, path);
  }
}

Json Describe(const Container& c) {
  Json storages = Json::array(), tensors = Json::array(), metadata = Json::object();
  for (uint32_t i = 0; i < c.storage_count(); ++i) {
    StorageInfo s = c.storage(i);
    storages.push_back({{"key", std::string(s.key)},
                        {"location", std::string(s.location)},
                        {"dtype", std::string(DTypeName(s.dtype))},
                        {"bytes", s.raw_bytes}});
  }
  for (uint32_t i = 0; i < c.tensor_count(); ++i) tensors.push_back(std::string(c.tensor(i).name));
  for (uint32_t i = 0; i < c.metadata_count(); ++i) {
    auto [k, v] = c.metadata(i);
    metadata[std::string(k)] = std::string(v);
  }
  return Json{{"storages", storages}, {"tensors", tensors}, {"metadata", metadata}, {"bytes", c.file_bytes()}};
}

Json TensorRecords(const Container& c) {
  Json out = Json::array();
  for (uint32_t i = 0; i < c.tensor_count(); ++i) {
    TensorInfo t = c.tensor(i);
    // storage .. byte_end: where its bytes lie, the storage's index in the file and the raw
    // byte range the view touches (empty for no elements), for load_into's host path.
    out.push_back({{"name", std::string(t.name)},
                   {"dtype", std::string(DTypeName(t.dtype))},
                   {"shape", t.shape},
                   {"stride", t.stride},
                   {"flags", t.flags},
                   {"extra", std::string(t.extra)},
                   {"storage", t.storage},
                   {"storage_offset", t.storage_offset},
                   {"byte_begin", t.byte_begin},
                   {"byte_end", t.byte_end}});
  }
  return out;
}

std::string VettedPickle(const Container& c, const std::vector<std::string>& allow_globals) {
  checkpoint::PickleReadOptions read;
  read.allow_globals = allow_globals;
  auto pickle = checkpoint::ReadObjectPickle(c, read);
  if (!pickle) throw Error(ErrorKind::kInvalidArgument, c.path() + ": no object pickle (data.pkl) to load");
  return std::string(reinterpret_cast<const char*>(pickle->bytes.data()), pickle->bytes.size());
}

std::shared_ptr<Container> HeldContainer(const Json& args) {
  return TheHandles().Get<Container>(args.at("checkpoint"), kCheckpointHandle);
}

namespace {

using Strings = std::vector<std::string>;

// A checkpoint named by "checkpoint" (a handle zckpt_open made) or opened from "path" for this call.
std::shared_ptr<Container> ContainerOf(const Json& args) {
  if (args.contains("checkpoint")) return HeldContainer(args);
  return OpenContainer(args.at("path").get<std::string>());
}

Json DescribeCall(const Json& args, Reply&) { return Describe(*ContainerOf(args)); }
Json TensorRecordsCall(const Json& args, Reply&) { return TensorRecords(*ContainerOf(args)); }

Json VettedPickleCall(const Json& args, Reply& reply) {
  return reply.Bytes(VettedPickle(*ContainerOf(args), args.at("allow_globals").get<Strings>()));
}

Json ReadBlob(const Json& args, Reply& reply) {
  auto path = args.at("path").get<std::string>();
  auto name = args.at("name").get<std::string>();
  auto c = OpenContainer(path);
  auto blob = c->FindBlob(name);
  if (!blob) throw Error(ErrorKind::kInvalidArgument, path + ": no blob '" + name + "'");
  auto checked = c->CheckedBlobBytes(*blob);
  return reply.Bytes(std::string(reinterpret_cast<const char*>(checked.data()), checked.size()));
}

Json Convert(const Json& args, Reply&) {
  auto src = args.at("src").get<std::string>();
  auto dst = args.at("dst").get<std::string>();
  ConvertOptions options;
  options.allow_globals = args.at("allow_globals").get<Strings>();
  if (auto chunk = args.at("chunk_bytes").get<uint64_t>()) options.writer.chunk_bytes = chunk;
  options.writer.zstd_level = args.at("zstd_level").get<int>();
  options.writer.threads = args.at("threads").get<unsigned>();
  std::string destination = dst.empty() ? DefaultDestination(src) : dst;
  ConvertStats s = ConvertFile(src, destination, options);
  return Json{{"destination", destination},           {"source_format", s.source_format},
              {"source_bytes", s.source_bytes},       {"storages", s.storages},
              {"tensors", s.tensors},                 {"file_bytes", s.written.file_bytes},
              {"chunks", s.written.chunks},           {"compressed_chunks", s.written.compressed_chunks}};
}

Json Export(const Json& args, Reply&) {
  auto format = args.at("format").get<std::string>();
  if (format != "pt" && format != "safetensors")
    throw Error(ErrorKind::kInvalidArgument, "export format must be 'pt' or 'safetensors', not '" + format + "'");
  ExportOptions options;
  options.format = format == "safetensors" ? ExportFormat::kSafetensors : ExportFormat::kTorch;
  options.allow_globals = args.at("allow_globals").get<Strings>();
  ExportFile(args.at("src").get<std::string>(), args.at("dst").get<std::string>(), options);
  return nullptr;
}

// VerifyPath (zckpt/verify.h): the problems of every file it checked, in order, each ProblemJson.
// A problem that is not a finding (IsFinding: the file could not be checked) is thrown as its
// Error, as `zckpt verify` exits 2 for it where it exits 1 for a finding.
Json Verify(const Json& args, Reply&) {
  VerifyPathOptions options;
  options.threads = Optional<unsigned>(args, "threads");
  Json problems = Json::array();
  for (const VerifiedFile& r : VerifyPath(args.at("path").get<std::string>(), options))
    for (const VerifyProblem& p : r.problems) {
      if (!IsFinding(p.kind)) throw Error(p.kind, p.message, p.place);
      problems.push_back(ProblemJson(p.kind, p.message, p.place));
    }
  return problems;
}

// The files the Python side reads and writes beside containers (DCP's .metadata, a checkpoint
// folder's other files), under the C++ readers' and writers' rules: only a regular file is read
// (a FIFO or device is refused, never blocks), a file that shrinks while read is an error naming
// it, and a destination appears whole or not at all, never replacing a non-regular file.
Json ReadRegularFile(const Json& args, Reply& reply) {
  MappedFile file(args.at("path").get<std::string>());
  std::string bytes(file.size(), '\0');
  file.ReadAt(0, bytes.size(), bytes.data());
  return reply.Bytes(std::move(bytes));
}

Json WriteFileAtomically(const Json& args, Reply&) {
  std::string_view data = ArgBytes(args.at("data"));
  AtomicFile out(args.at("path").get<std::string>());
  out.Write(data.data(), data.size());
  out.Commit();
  return nullptr;
}

Json CopyFileAtomically(const Json& args, Reply&) {
  checkpoint::CopyFileTo(args.at("src").get<std::string>(), args.at("dst").get<std::string>());
  return nullptr;
}

// Object storage folders and small objects (zckpt/object_store.h): what the Python layer's path
// helpers (zckpt/_paths.py) use for s3:// folders, DCP's .metadata and indexes.
Json IsObjectUrlCall(const Json& args, Reply&) { return IsObjectUrl(args.at("path").get<std::string>()); }
Json ObjectExistsCall(const Json& args, Reply&) { return ObjectExists(args.at("url").get<std::string>()); }
Json IsObjectFolderCall(const Json& args, Reply&) { return IsObjectFolder(args.at("url").get<std::string>()); }

Json ListObjectsCall(const Json& args, Reply&) {
  Json out = Json::array();
  for (const ObjectEntry& e : ListObjects(args.at("folder_url").get<std::string>()))
    out.push_back(Json::array({e.name, e.size}));
  return out;
}

Json ReadObjectCall(const Json& args, Reply& reply) {
  return reply.Bytes(ReadObject(args.at("url").get<std::string>(), args.at("max_bytes").get<uint64_t>()));
}

Json WriteObjectCall(const Json& args, Reply&) {
  WriteObject(args.at("url").get<std::string>(), ArgBytes(args.at("data")));
  return nullptr;
}

// load_into's checks (loader/into_check.h, LoadInto's too) of "targets", each [name, strided,
// device, has_storage, dtype, shape], against the open "checkpoint": {"matched": [[target index,
// tensor index], ...], "missing": [...], "unexpected": [...]}, or the error listing every problem.
Json CheckIntoCall(const Json& args, Reply&) {
  std::vector<loader::TargetFacts> targets;
  for (const Json& t : args.at("targets"))
    targets.push_back({t.at(0).get<std::string>(), t.at(1).get<bool>(), t.at(2).get<std::string>(), t.at(3).get<bool>(),
                       t.at(4).get<std::string>(), t.at(5).get<std::vector<int64_t>>()});
  loader::IntoMatch match = loader::CheckInto(*HeldContainer(args), targets, args.at("strict").get<bool>());
  Json matched = Json::array();
  for (auto [target, tensor] : match.matched) matched.push_back(Json::array({target, tensor}));
  return Json{{"matched", matched}, {"missing", match.missing}, {"unexpected", match.unexpected}};
}

// The format's constants the Python package needs, from their C++ homes (zckpt/format.h,
// checkpoint/dcp_layout.h, common/stale_temps.h), so no Python module retypes them.
Json FormatConstants(const Json&, Reply&) {
  namespace f = format;
  return Json{
      {"container_magic", std::vector<int>(std::begin(f::kSuperblockMagic), std::end(f::kSuperblockMagic))},
      {"tensor_flags",
       {{"requires_grad", f::kTensorRequiresGrad}, {"parameter", f::kTensorParameter}, {"conj", f::kTensorConj},
        {"neg", f::kTensorNeg}, {"dtensor", f::kTensorDTensorLocal}, {"sharded", f::kTensorShardedLocal},
        {"quantized", f::kTensorQuantized}, {"internal", f::kTensorInternal}}},
      {"dcp",
       {{"metadata_name", std::string(dcp::kMetadataName)}, {"container_suffix", std::string(dcp::kContainerSuffix)},
        {"piece_class", std::string(dcp::kPieceClass)}, {"bytes_blob_prefix", std::string(dcp::kBytesBlobPrefix)},
        {"bytes_at_blob", std::string(dcp::kBytesAtBlob)}}},
      {"stale_temp_seconds", kStaleTempSeconds},
  };
}

}  // namespace

void AddContainerCalls(CallTable& calls) {
  calls["describe"] = DescribeCall;
  calls["tensor_records"] = TensorRecordsCall;
  calls["vetted_pickle"] = VettedPickleCall;
  calls["read_blob"] = ReadBlob;
  calls["convert"] = Convert;
  calls["export"] = Export;
  calls["verify"] = Verify;
  calls["read_regular_file"] = ReadRegularFile;
  calls["write_file_atomically"] = WriteFileAtomically;
  calls["copy_file_atomically"] = CopyFileAtomically;
  calls["is_object_url"] = IsObjectUrlCall;
  calls["object_exists"] = ObjectExistsCall;
  calls["is_object_folder"] = IsObjectFolderCall;
  calls["list_objects"] = ListObjectsCall;
  calls["read_object"] = ReadObjectCall;
  calls["write_object"] = WriteObjectCall;
  calls["format_constants"] = FormatConstants;
  calls["check_into"] = CheckIntoCall;
}

}  // namespace zckpt::python
