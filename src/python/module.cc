// zckpt._C: the C++ side of the `zckpt` Python package (src/python/zckpt/*.py holds the API).
//
// Built against torch's own headers and its bundled pybind11, so at::Tensor crosses into Python
// through torch's type casters exactly as in a torch C++ extension. Every call that streams data
// releases the GIL. zckpt::Error becomes zckpt.ZckptError (CorruptError, UnsafeError, and
// OutOfMemoryError, also a torch.OutOfMemoryError, for those kinds), carrying the C++ message
// and, as attributes, the Error's place (PlaceFields).
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checkpoint/object_pickle.h"
#include "checkpoint/source_kind.h"
#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/verify.h"
#include "zckpt/error.h"
#include "zckpt/format.h"
#include "zckpt/load_regions.h"
#include "zckpt/loader.h"
#include "zckpt/object_store.h"
#include "zckpt/tensor_stream.h"

namespace py = pybind11;

namespace zckpt {

void RegisterSharded(py::module_& m);  // sharded_module.cc

namespace {

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

// The ring of a load from Python's keyword arguments (threads=, slots=, slot_bytes=; None: the
// library's default, ResolveLoadSizes).
struct Ring {
  std::optional<unsigned> threads;
  std::optional<unsigned> slots;
  std::optional<uint64_t> slot_bytes;
};

LoadOptions ToOptions(bool verify, const Ring& ring) {
  LoadOptions options;
  options.verify = verify;
  options.threads = ring.threads;
  options.slots = ring.slots;
  options.slot_bytes = ring.slot_bytes;
  return options;
}

py::dict StoragesToDict(const std::map<std::string, at::Tensor>& storages) {
  py::dict out;
  for (const auto& [key, t] : storages) out[py::str(key)] = t;
  return out;
}

// Storages onto their devices (`devices`: key -> "cpu", "cuda:1", ...), all in one streaming
// pass: each device receives its own storages only.
py::dict LoadStoragesTo(const Container& c, const std::map<std::string, std::string>& devices, bool verify,
                        const Ring& ring) {
  std::map<std::string, c10::Device> where;
  for (const auto& [key, dev] : devices) where.emplace(key, c10::Device(dev));
  std::map<std::string, at::Tensor> storages;
  {
    py::gil_scoped_release release;
    storages = LoadStorages(c, where, c10::Device(c10::kCPU), ToOptions(verify, ring)).storages_by_key;
  }
  return StoragesToDict(storages);
}

py::dict MapStoragesToDict(const Container& c, bool verify, std::optional<unsigned> threads) {
  std::map<std::string, at::Tensor> storages;
  {
    py::gil_scoped_release release;
    MapOptions options;
    options.verify = verify;
    if (threads) options.threads = *threads;
    storages = MapStorages(c, options).storages_by_key;  // storages only: quantized files map too
  }
  return StoragesToDict(storages);
}

std::pair<std::vector<std::string>, std::vector<std::string>> LoadIntoTargets(
    const Container& c, const std::vector<std::pair<std::string, at::Tensor>>& targets, bool strict, bool verify,
    const std::vector<std::string>& allow_globals, const Ring& ring) {
  py::gil_scoped_release release;
  LoadIntoOptions options;
  options.strict = strict;
  options.base = ToOptions(verify, ring);
  options.base.allow_globals = allow_globals;
  LoadIntoReport report;
  try {
    report = LoadInto(c, targets, options);
  } catch (const Error& e) {
    throw checkpoint::WithNotAContainerHint(e, c.path());  // a .pt given by mistake: convert it first
  }
  return {report.missing, report.unexpected};
}

// (name, first element, target) triples: element runs of LoadRegions (zckpt/load_regions.h).
// Returns the bytes copied.
uint64_t LoadRangesInto(const Container& c, const std::vector<std::tuple<std::string, uint64_t, at::Tensor>>& ranges,
                        bool verify, const std::vector<std::string>& allow_globals, const Ring& ring) {
  std::vector<Region> regions;
  regions.reserve(ranges.size());
  for (const auto& [name, begin, target] : ranges) regions.push_back(ElementRun(name, begin, target));
  py::gil_scoped_release release;
  LoadOptions options = ToOptions(verify, ring);
  options.allow_globals = allow_globals;
  return LoadRegions(c, regions, options).stats.raw_bytes;
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

// The C++ API's object tree (TensorSet::tree, built by zckpt's own interpreter, not torch's
// unpickler) as Python objects: how the tests hold it against torch.load of the source file.
// IValue -> Python, keeping sharing: a container or tensor met twice is one Python object. Strings
// that are not UTF-8 (pickled bytes) become bytes; torch's toPyObject would raise on them.
py::object TreeToPython(const c10::IValue& v, std::map<const void*, py::object>& memo) {
  if (v.isNone()) return py::none();
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isTensor()) return py::cast(v.toTensor());
  if (v.isDevice()) return py::cast(v.toDevice());
  if (v.isString()) {
    const std::string& s = v.toStringRef();
    PyObject* u = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
    if (u) return py::reinterpret_steal<py::object>(u);
    PyErr_Clear();
    return py::bytes(s);
  }
  const void* key = v.isIntrusivePtr() ? v.internalToPointer() : nullptr;
  if (auto it = memo.find(key); key && it != memo.end()) return it->second;
  py::object out;
  if (v.isTuple()) {
    const auto& items = v.toTupleRef().elements();
    py::tuple t(items.size());
    for (size_t i = 0; i < items.size(); ++i) t[i] = TreeToPython(items[i], memo);
    out = t;
  } else if (v.isList()) {
    py::list l;
    memo[key] = l;
    for (const c10::IValue& item : v.toListRef()) l.append(TreeToPython(item, memo));
    out = l;
  } else if (v.isGenericDict()) {
    py::dict d;
    memo[key] = d;
    for (const auto& entry : v.toGenericDict()) d[TreeToPython(entry.key(), memo)] = TreeToPython(entry.value(), memo);
    out = d;
  } else {
    throw Error(ErrorKind::kInvalidArgument, "object tree holds an IValue of kind " + v.tagKind());
  }
  memo[key] = out;
  return out;
}

py::object LoadTree(const std::string& path, const std::string& device, bool map,
                    const std::vector<std::string>& allow_globals) {
  c10::IValue tree;
  {
    py::gil_scoped_release release;
    if (map) {
      MapOptions options;
      options.allow_globals = allow_globals;
      tree = Map(path, options).tree;
    } else {
      LoadOptions options;
      options.allow_globals = allow_globals;
      tree = Load(path, c10::Device(device), options).tree;
    }
  }
  std::map<const void*, py::object> memo;
  return TreeToPython(tree, memo);
}

// TensorStream (zckpt/tensor_stream.h) over one open checkpoint: zckpt.iter_tensors's source.
std::unique_ptr<TensorStream> OpenTensorStream(std::shared_ptr<Container> c, const std::string& device, bool verify,
                                               bool verify_first, const std::vector<std::string>& allow_globals) {
  py::gil_scoped_release release;
  TensorStreamOptions options;
  options.load.verify = verify;
  options.load.allow_globals = allow_globals;
  options.verify_first = verify_first;
  return std::make_unique<TensorStream>(std::move(c), c10::Device(device), options);
}

// Map (zckpt/loader.h) without the object tree: (name, CPU view aliasing the file's mapping) per
// tensor record in table order, internal records left out; with verify every chunk checked first.
py::list MapTensors(const Container& c, bool verify, const std::vector<std::string>& allow_globals) {
  MapResult r;
  {
    py::gil_scoped_release release;
    MapOptions options;
    options.verify = verify;
    options.object_tree = false;
    options.allow_globals = allow_globals;
    r = Map(c, options);
  }
  py::list out;
  for (size_t i = 0; i < r.tensors.size(); ++i)
    if (!(r.meta[i].flags & format::kTensorInternal)) out.append(py::make_tuple(r.tensors[i].first, r.tensors[i].second));
  return out;
}

py::object NextTensor(TensorStream& s) {
  std::string name;
  at::Tensor t;
  bool more;
  {
    py::gil_scoped_release release;
    more = s.Next(&name, &t);
  }
  if (!more) throw py::stop_iteration();
  return py::make_tuple(name, t);
}

}  // namespace

void BindSave(py::module_& m);  // save_bindings.cc

}  // namespace zckpt

PYBIND11_MODULE(_C, m) {
  m.doc() = "zckpt C++ core (use the `zckpt` package's functions)";
  static py::exception<zckpt::Error> base(m, "ZckptError", PyExc_RuntimeError);
  static py::exception<zckpt::Error> corrupt(m, "CorruptError", base.ptr());
  static py::exception<zckpt::Error> unsafe(m, "UnsafeError", base.ptr());
  // A ZckptError that is also a torch.OutOfMemoryError: resume code catches it as it catches
  // torch's own. Never freed (the interpreter may outlive this module's statics).
  static PyObject* oom = PyErr_NewException(
      "zckpt._C.OutOfMemoryError", py::make_tuple(base, py::module_::import("torch").attr("OutOfMemoryError")).ptr(),
      nullptr);
  if (oom == nullptr) throw py::error_already_set();
  m.attr("OutOfMemoryError") = py::handle(oom);
  // Every ZckptError has the attributes of zckpt::PlaceFields: None on the class, set from the
  // Error's place when it comes from C++ (a CorruptError names its file, storage, chunk, ...).
  for (auto field : zckpt::PlaceFields({})) base.attr(field.first) = py::none();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const zckpt::Error& e) {
      PyObject* type = e.kind() == zckpt::ErrorKind::kCorrupt       ? corrupt.ptr()
                       : e.kind() == zckpt::ErrorKind::kUnsafe      ? unsafe.ptr()
                       : e.kind() == zckpt::ErrorKind::kOutOfMemory ? oom
                                                                    : base.ptr();
      try {
        py::object exc = py::reinterpret_borrow<py::object>(type)(e.what());
        for (auto field : zckpt::PlaceFields(e.place())) py::setattr(exc, field.first, field.second);
        PyErr_SetObject(type, exc.ptr());
      } catch (const py::error_already_set&) {  // the message alone, as an error cannot be lost
        PyErr_SetString(type, e.what());
      }
    }
  });
  // One open checkpoint (module.cc, above Describe): what zckpt.load reads everything through.
  using zckpt::Container;
  py::class_<zckpt::Ring>(m, "Ring")
      .def(py::init([](std::optional<unsigned> threads, std::optional<unsigned> slots, std::optional<uint64_t> slot_bytes) {
             return zckpt::Ring{threads, slots, slot_bytes};
           }), py::arg("threads") = py::none(), py::arg("slots") = py::none(), py::arg("slot_bytes") = py::none())
      .def_readonly("threads", &zckpt::Ring::threads)
      .def_readonly("slots", &zckpt::Ring::slots)
      .def_readonly("slot_bytes", &zckpt::Ring::slot_bytes);
  py::class_<Container, std::shared_ptr<Container>>(m, "Checkpoint")
      .def_property_readonly("path", &Container::path)
      .def("describe", [](const Container& c) { return zckpt::Describe(&c); })
      .def("tensor_records", [](const Container& c) { return zckpt::TensorRecords(&c); })
      .def("vetted_pickle", &zckpt::VettedPickle, py::arg("allow_globals") = std::vector<std::string>{})
      .def("load_storages", &zckpt::LoadStoragesTo, py::arg("devices"), py::arg("verify") = true,
           py::arg("ring") = zckpt::Ring{})
      .def("map_storages", &zckpt::MapStoragesToDict, py::arg("verify") = false, py::arg("threads") = py::none())
      .def("map_tensors", &zckpt::MapTensors, py::arg("verify") = true,
           py::arg("allow_globals") = std::vector<std::string>{})
      .def("load_into", &zckpt::LoadIntoTargets, py::arg("targets"), py::arg("strict") = true,
           py::arg("verify") = true, py::arg("allow_globals") = std::vector<std::string>{},
           py::arg("ring") = zckpt::Ring{})
      .def("load_ranges", &zckpt::LoadRangesInto, py::arg("ranges"), py::arg("verify") = true,
           py::arg("allow_globals") = std::vector<std::string>{}, py::arg("ring") = zckpt::Ring{});
  py::class_<zckpt::TensorStream>(m, "TensorStream")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &zckpt::NextTensor)
      .def("__len__", &zckpt::TensorStream::remaining);
  m.def("tensor_stream", &zckpt::OpenTensorStream, py::arg("checkpoint"), py::arg("device") = "cpu",
        py::arg("verify") = true, py::arg("verify_first") = false,
        py::arg("allow_globals") = std::vector<std::string>{});
  m.def("open", [](const std::string& path) { return std::shared_ptr<Container>(zckpt::OpenContainer(path)); },
        py::arg("path"));
  m.def("describe", [](const std::string& path) { return zckpt::Describe(zckpt::OpenContainer(path).get()); },
        py::arg("path"));
  m.def("load_tree", &zckpt::LoadTree, py::arg("path"), py::arg("device") = "cpu", py::arg("map") = false,
        py::arg("allow_globals") = std::vector<std::string>{});
  m.def("read_blob", &zckpt::ReadBlob, py::arg("path"), py::arg("name"));
  m.def("vetted_pickle", [](const std::string& path, const std::vector<std::string>& allow) {
    return zckpt::VettedPickle(*zckpt::OpenContainer(path), allow);
  }, py::arg("path"), py::arg("allow_globals") = std::vector<std::string>{});
  m.def("tensor_records", [](const std::string& path) { return zckpt::TensorRecords(zckpt::OpenContainer(path).get()); },
        py::arg("path"));
  m.def("convert", &zckpt::Convert, py::arg("src"), py::arg("dst") = "", py::arg("chunk_bytes") = 0,
        py::arg("zstd_level") = 0, py::arg("threads") = 0, py::arg("allow_globals") = std::vector<std::string>{});
  m.def("export", &zckpt::Export, py::arg("src"), py::arg("dst"), py::arg("format") = "pt",
        py::arg("allow_globals") = std::vector<std::string>{});
  m.def("verify", &zckpt::Verify, py::arg("path"), py::arg("threads") = py::none());
  // Object storage folders and small objects (zckpt/object_store.h): what the Python layer's
  // path helpers (zckpt/_paths.py) use for s3:// folders, DCP's .metadata and indexes.
  m.def("is_object_url", [](const std::string& p) { return zckpt::IsObjectUrl(p); }, py::arg("path"));
  m.def("object_exists", [](const std::string& url) {
    py::gil_scoped_release release;
    return zckpt::ObjectExists(url);
  }, py::arg("url"));
  m.def("is_object_folder", [](const std::string& url) {
    py::gil_scoped_release release;
    return zckpt::IsObjectFolder(url);
  }, py::arg("url"));
  m.def("list_objects", [](const std::string& url) {
    std::vector<zckpt::ObjectEntry> entries;
    {
      py::gil_scoped_release release;
      entries = zckpt::ListObjects(url);
    }
    std::vector<std::pair<std::string, uint64_t>> out;
    for (auto& e : entries) out.emplace_back(std::move(e.name), e.size);
    return out;
  }, py::arg("folder_url"));
  m.def("read_object", [](const std::string& url, uint64_t max_bytes) {
    std::string bytes;
    {
      py::gil_scoped_release release;
      bytes = zckpt::ReadObject(url, max_bytes);
    }
    return py::bytes(bytes);
  }, py::arg("url"), py::arg("max_bytes") = uint64_t{1} << 30);
  m.def("write_object", [](const std::string& url, const py::bytes& data) {
    std::string bytes = data;
    py::gil_scoped_release release;
    zckpt::WriteObject(url, bytes);
  }, py::arg("url"), py::arg("data"));
  zckpt::BindSave(m);
  zckpt::RegisterSharded(m);
}
