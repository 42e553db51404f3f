#include "python/core_functions.h"

#include <exception>
#include <utility>

#include "checkpoint/folder.h"
#include "checkpoint/object_pickle.h"
#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "checkpoint/source_kind.h"
#include "zckpt/convert.h"
#include "zckpt/format.h"
#include "zckpt/object_store.h"
#include "zckpt/verify.h"

namespace zckpt::python {

// Container::Open, its "not a container" error hinting at `zckpt convert` when the file is a
// .pt or safetensors file (zckpt.load("x.pt")). Called with the GIL held, which it lets go of:
// opening reads the index, from an object by HEAD and ranged GETs, while other Python threads
// (a fault proxy in the tests, a trainer's own) go on.
std::unique_ptr<Container> OpenContainer(const std::string& path) {
  py::gil_scoped_release release;
  try {
    return Container::Open(path);
  } catch (const Error& e) {
    throw checkpoint::WithNotAContainerHint(e, path);
  }
}

namespace {

// Each function below that reads a container takes one opened by the caller: zckpt/_api.py opens a
// checkpoint once (`_C.open`) and asks that one open file for its metadata, its vetted pickle and
// its storages, so a file renamed over the path in between cannot mix two checkpoints
// (include/zckpt/loader.h). The path-taking module functions open the file for one call.
py::dict Describe(const Container* c) {
  py::list storages, tensors;
  for (uint32_t i = 0; i < c->storage_count(); ++i) {
    StorageInfo s = c->storage(i);
    py::dict d;
    d["key"] = std::string(s.key);
    d["location"] = std::string(s.location);
    d["dtype"] = std::string(DTypeName(s.dtype));
    d["bytes"] = s.raw_bytes;
    storages.append(d);
  }
  for (uint32_t i = 0; i < c->tensor_count(); ++i) tensors.append(std::string(c->tensor(i).name));
  py::dict metadata;
  for (uint32_t i = 0; i < c->metadata_count(); ++i) {
    auto [k, v] = c->metadata(i);
    metadata[py::str(std::string(k))] = py::str(std::string(v));
  }
  py::dict out;
  out["storages"] = storages;
  out["tensors"] = tensors;
  out["metadata"] = metadata;
  out["bytes"] = c->file_bytes();
  return out;
}

// Every tensor record: what the converter learned of each tensor (shape, flags, and the JSON
// `extra` carrying a ShardedTensor shard's offsets/sizes/placement or a DTensor's placements and
// mesh), read from the index alone.
py::list TensorRecords(const Container* c) {
  py::list out;
  for (uint32_t i = 0; i < c->tensor_count(); ++i) {
    TensorInfo t = c->tensor(i);
    py::dict d;
    d["name"] = std::string(t.name);
    d["dtype"] = std::string(DTypeName(t.dtype));
    d["shape"] = t.shape;
    d["stride"] = t.stride;
    d["flags"] = t.flags;
    d["extra"] = std::string(t.extra);
    // Where its bytes lie: the storage's index in the file and the raw byte range the view
    // touches (empty for no elements), for load_into's host path.
    d["storage"] = t.storage;
    d["storage_offset"] = t.storage_offset;
    d["byte_begin"] = t.byte_begin;
    d["byte_end"] = t.byte_end;
    out.append(d);
  }
  return out;
}

py::bytes ReadBlob(const std::string& path, const std::string& name) {
  auto c = OpenContainer(path);
  auto blob = c->FindBlob(name);
  if (!blob) throw Error(ErrorKind::kInvalidArgument, path + ": no blob '" + name + "'");
  std::string bytes;
  {
    py::gil_scoped_release release;
    auto checked = c->CheckedBlobBytes(*blob);
    bytes.assign(reinterpret_cast<const char*>(checked.data()), checked.size());
  }
  return py::bytes(bytes);
}

// The object pickle, read by zckpt's interpreter under the allowlist plus `allow_globals` and
// checked against the index, before Python hands it to torch's unpickler: the bytes returned are
// the ones vetted. Errors as ReadObjectPickle (UnsafeError, CorruptError naming the file).
py::bytes VettedPickle(const Container& c, const std::vector<std::string>& allow_globals) {
  std::string bytes;
  {
    py::gil_scoped_release release;
    checkpoint::PickleReadOptions read;
    read.allow_globals = allow_globals;
    auto pickle = checkpoint::ReadObjectPickle(c, read);
    if (!pickle) throw Error(ErrorKind::kInvalidArgument, c.path() + ": no object pickle (data.pkl) to load");
    bytes.assign(reinterpret_cast<const char*>(pickle->bytes.data()), pickle->bytes.size());
  }
  return py::bytes(bytes);
}


py::dict Convert(const std::string& src, const std::string& dst, uint64_t chunk_bytes, int zstd_level,
                 unsigned threads, const std::vector<std::string>& allow_globals) {
  ConvertOptions options;
  options.allow_globals = allow_globals;
  if (chunk_bytes) options.writer.chunk_bytes = chunk_bytes;
  options.writer.zstd_level = zstd_level;
  options.writer.threads = threads;
  std::string destination = dst.empty() ? DefaultDestination(src) : dst;
  ConvertStats s;
  {
    py::gil_scoped_release release;
    s = ConvertFile(src, destination, options);
  }
  py::dict out;
  out["destination"] = destination;
  out["source_format"] = s.source_format;
  out["source_bytes"] = s.source_bytes;
  out["storages"] = s.storages;
  out["tensors"] = s.tensors;
  out["file_bytes"] = s.written.file_bytes;
  out["chunks"] = s.written.chunks;
  out["compressed_chunks"] = s.written.compressed_chunks;
  return out;
}

void Export(const std::string& src, const std::string& dst, const std::string& format,
            const std::vector<std::string>& allow_globals) {
  if (format != "pt" && format != "safetensors")
    throw Error(ErrorKind::kInvalidArgument, "export format must be 'pt' or 'safetensors', not '" + format + "'");
  py::gil_scoped_release release;
  ExportOptions options;
  options.format = format == "safetensors" ? ExportFormat::kSafetensors : ExportFormat::kTorch;
  options.allow_globals = allow_globals;
  ExportFile(src, dst, options);
}

// VerifyPath (zckpt/verify.h): the problems of every file it checked, in order, each a dict:
// "kind" ("corrupt" or "unsafe": ErrorKindName), "message", and PlaceFields. A problem that is not
// a finding (IsFinding: the file could not be checked) raises as its Error, as `zckpt verify`
// exits 2 for it where it exits 1 for a finding.
py::list Verify(const std::string& path, std::optional<unsigned> threads) {
  std::vector<VerifiedFile> files;
  {
    py::gil_scoped_release release;
    VerifyPathOptions options;
    options.threads = threads;
    files = VerifyPath(path, options);
  }
  py::list problems;
  for (const VerifiedFile& r : files)
    for (const VerifyProblem& p : r.problems) {
      if (!IsFinding(p.kind)) throw Error(p.kind, p.message, p.place);
      py::dict d = PlaceFields(p.place);
      d["kind"] = ErrorKindName(p.kind);
      d["message"] = p.message;
      problems.append(d);
    }
  return problems;
}

}  // namespace

// Where an error lies (ErrorPlace) as Python values: {"file", "storage", "tensors" (a list),
// "chunk", "file_bytes", "storage_bytes" ((begin, end) tuples)}, None for what it is not about.
// The attributes every ZckptError raised from here carries, and the fields of zckpt.verify's
// problems.
py::dict PlaceFields(const ErrorPlace& place) {
  auto text = [](const std::string& s) -> py::object { return s.empty() ? py::none() : py::object(py::str(s)); };
  auto range = [](const std::optional<ByteRange>& r) -> py::object {
    return r ? py::object(py::make_tuple(r->begin, r->end)) : py::none();
  };
  py::dict d;
  d["file"] = text(place.file);
  d["storage"] = text(place.storage);
  d["tensors"] = place.tensors.empty() ? py::none() : py::object(py::cast(place.tensors));
  d["chunk"] = place.chunk < 0 ? py::none() : py::object(py::int_(place.chunk));
  d["file_bytes"] = range(place.file_bytes);
  d["storage_bytes"] = range(place.storage_bytes);
  return d;
}

namespace {
// This module's classes (BindErrors); never freed, as the interpreter may outlive the module.
ErrorClasses* error_classes = nullptr;
}  // namespace

void SetOutOfMemoryClass(const py::object& cls) { error_classes->oom = cls; }

void BindErrors(const ErrorClasses& classes) {
  // Every class has the attributes of PlaceFields: None on the class, set from the Error's place.
  for (auto field : PlaceFields({})) classes.base.attr(field.first) = py::none();
  error_classes = new ErrorClasses(classes);
  py::register_local_exception_translator([](std::exception_ptr p) {  // this module's calls only
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      const ErrorClasses* kinds = error_classes;
      const py::object& type = e.kind() == ErrorKind::kCorrupt       ? kinds->corrupt
                               : e.kind() == ErrorKind::kUnsafe      ? kinds->unsafe
                               : e.kind() == ErrorKind::kOutOfMemory ? kinds->oom
                                                                     : kinds->base;
      try {
        py::object exc = type(e.what());
        for (auto field : PlaceFields(e.place())) py::setattr(exc, field.first, field.second);
        PyErr_SetObject(type.ptr(), exc.ptr());
      } catch (const py::error_already_set&) {  // the message alone, as an error cannot be lost
        PyErr_SetString(type.ptr(), e.what());
      }
    }
  });
}

py::dict SaveStatsDict(const std::string& path, const SaveStats& s) {
  py::dict out;
  out["destination"] = path;
  out["storages"] = s.storages;
  out["tensors"] = s.tensors;
  out["raw_bytes"] = s.written.raw_bytes;
  out["file_bytes"] = s.written.file_bytes;
  out["chunks"] = s.written.chunks;
  out["compressed_chunks"] = s.written.compressed_chunks;
  out["cuda_bytes"] = s.cuda_bytes;
  out["cuda_ring_bytes"] = s.cuda_ring_bytes;
  out["seconds"] = s.seconds;
  return out;
}

namespace {

// The files the Python side reads and writes beside containers (DCP's .metadata, a checkpoint
// folder's other files), under the C++ readers' and writers' rules: only a regular file is read
// (a FIFO or device is refused, never blocks), a file that shrinks while read is an error naming
// it, and a destination appears whole or not at all, never replacing a non-regular file.
py::bytes ReadRegularFile(const std::string& path) {
  MappedFile file(path);
  std::string bytes(file.size(), '\0');
  file.ReadAt(0, bytes.size(), bytes.data());
  return py::bytes(bytes);
}

void WriteFileAtomically(const std::string& path, const py::bytes& data) {
  std::string_view v = data;
  AtomicFile out(path);
  out.Write(v.data(), v.size());
  out.Commit();
}

}  // namespace

void BindCommon(py::module_& m, py::class_<Container, std::shared_ptr<Container>>& checkpoint) {
  checkpoint.def_property_readonly("path", &Container::path)
      .def("describe", [](const Container& c) { return Describe(&c); })
      .def("tensor_records", [](const Container& c) { return TensorRecords(&c); })
      .def("vetted_pickle", &VettedPickle, py::arg("allow_globals") = std::vector<std::string>{});
  m.def("open", [](const std::string& path) { return std::shared_ptr<Container>(OpenContainer(path)); },
        py::arg("path"));
  m.def("describe", [](const std::string& path) { return Describe(OpenContainer(path).get()); }, py::arg("path"));
  m.def("read_blob", &ReadBlob, py::arg("path"), py::arg("name"));
  m.def("vetted_pickle", [](const std::string& path, const std::vector<std::string>& allow) {
    return VettedPickle(*OpenContainer(path), allow);
  }, py::arg("path"), py::arg("allow_globals") = std::vector<std::string>{});
  m.def("tensor_records", [](const std::string& path) { return TensorRecords(OpenContainer(path).get()); },
        py::arg("path"));
  m.def("convert", &Convert, py::arg("src"), py::arg("dst") = "", py::arg("chunk_bytes") = 0,
        py::arg("zstd_level") = 0, py::arg("threads") = 0, py::arg("allow_globals") = std::vector<std::string>{});
  m.def("export", &Export, py::arg("src"), py::arg("dst"), py::arg("format") = "pt",
        py::arg("allow_globals") = std::vector<std::string>{});
  m.def("verify", &Verify, py::arg("path"), py::arg("threads") = py::none());
  // Object storage folders and small objects (zckpt/object_store.h): what the Python layer's
  // path helpers (zckpt/_paths.py) use for s3:// folders, DCP's .metadata and indexes.
  m.def("is_object_url", [](const std::string& p) { return IsObjectUrl(p); }, py::arg("path"));
  m.def("object_exists", [](const std::string& url) {
    py::gil_scoped_release release;
    return ObjectExists(url);
  }, py::arg("url"));
  m.def("is_object_folder", [](const std::string& url) {
    py::gil_scoped_release release;
    return IsObjectFolder(url);
  }, py::arg("url"));
  m.def("list_objects", [](const std::string& url) {
    std::vector<ObjectEntry> entries;
    {
      py::gil_scoped_release release;
      entries = ListObjects(url);
    }
    std::vector<std::pair<std::string, uint64_t>> out;
    for (auto& e : entries) out.emplace_back(std::move(e.name), e.size);
    return out;
  }, py::arg("folder_url"));
  m.def("read_object", [](const std::string& url, uint64_t max_bytes) {
    std::string bytes;
    {
      py::gil_scoped_release release;
      bytes = ReadObject(url, max_bytes);
    }
    return py::bytes(bytes);
  }, py::arg("url"), py::arg("max_bytes") = uint64_t{1} << 30);
  m.def("write_object", [](const std::string& url, const py::bytes& data) {
    std::string bytes = data;
    py::gil_scoped_release release;
    WriteObject(url, bytes);
  }, py::arg("url"), py::arg("data"));
  m.def("read_regular_file", &ReadRegularFile, py::arg("path"));
  m.def("write_file_atomically", &WriteFileAtomically, py::arg("path"), py::arg("data"));
  m.def("copy_file_atomically", &checkpoint::CopyFileTo, py::arg("src"), py::arg("dst"));
}

}  // namespace zckpt::python
