// zckpt._C: the C++ side of the `zckpt` Python package (src/python/zckpt/*.py holds the API).
//
// Built against torch's own headers and its bundled pybind11, so at::Tensor crosses into Python
// through torch's type casters exactly as in a torch C++ extension. Every call that streams data
// releases the GIL. zckpt::Error becomes zckpt.ZckptError (CorruptError, UnsafeError, and
// OutOfMemoryError, also a torch.OutOfMemoryError, for those kinds), carrying the C++ message
// and, as attributes, the Error's place (PlaceJson, core_calls.h). What needs no torch
// (describe, convert, verify, ...) is core_functions.cc's, bound here and in zckpt._core alike.
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checkpoint/source_kind.h"
#include "python/core_functions.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"
#include "zckpt/load_regions.h"
#include "zckpt/loader.h"
#include "zckpt/tensor_stream.h"

namespace py = pybind11;

namespace zckpt {

namespace {

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
  // The error classes are the torch-free module's (zckpt/_errors.py), so `except zckpt.CorruptError`
  // catches what either module raises; OutOfMemoryError is _oom.py's (also torch's), which
  // importing _oom hands to _errors.for_kind.
  py::module_ errors = py::module_::import("zckpt._errors");
  for (const char* name : {"ZckptError", "CorruptError", "UnsafeError"}) m.attr(name) = errors.attr(name);
  m.attr("OutOfMemoryError") = py::module_::import("zckpt._oom").attr("OutOfMemoryError");
  zckpt::python::BindErrors(errors.attr("for_kind"));
  // One open checkpoint: what zckpt.load reads everything through (core_functions.h).
  using zckpt::Container;
  py::class_<zckpt::Ring>(m, "Ring")
      .def(py::init([](std::optional<unsigned> threads, std::optional<unsigned> slots, std::optional<uint64_t> slot_bytes) {
             return zckpt::Ring{threads, slots, slot_bytes};
           }), py::arg("threads") = py::none(), py::arg("slots") = py::none(), py::arg("slot_bytes") = py::none())
      .def_readonly("threads", &zckpt::Ring::threads)
      .def_readonly("slots", &zckpt::Ring::slots)
      .def_readonly("slot_bytes", &zckpt::Ring::slot_bytes);
  // module_local: `_core` registers the same C++ class; neither module sees the other's.
  py::class_<Container, std::shared_ptr<Container>> checkpoint(m, "Checkpoint", py::module_local());
  zckpt::python::BindCommon(m, checkpoint);
  checkpoint
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
  m.def("load_tree", &zckpt::LoadTree, py::arg("path"), py::arg("device") = "cpu", py::arg("map") = false,
        py::arg("allow_globals") = std::vector<std::string>{});
  zckpt::BindSave(m);
}
