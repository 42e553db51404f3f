#include "python/core_functions.h"

#include <pybind11/stl.h>

#include <exception>
#include <utility>
#include <vector>

namespace zckpt::python {

py::object ToPython(const Json& v, const Reply& reply) {
  switch (v.type()) {
    case Json::value_t::null: return py::none();
    case Json::value_t::boolean: return py::bool_(v.get<bool>());
    case Json::value_t::number_integer: return py::int_(v.get<int64_t>());
    case Json::value_t::number_unsigned: return py::int_(v.get<uint64_t>());
    case Json::value_t::number_float: return py::float_(v.get<double>());
    case Json::value_t::string: return py::str(v.get<std::string>());
    case Json::value_t::array: {
      py::list out;
      for (const Json& e : v) out.append(ToPython(e, reply));
      return out;
    }
    default: {
      if (v.size() == 1 && v.contains("$bytes")) return py::bytes(reply.bytes().at(v["$bytes"].get<size_t>()));
      py::dict out;
      for (const auto& [k, e] : v.items())
        out[py::str(k)] = (k == "file_bytes" || k == "storage_bytes") && e.is_array()
                              ? py::object(py::tuple(ToPython(e, reply)))
                              : ToPython(e, reply);
      return out;
    }
  }
}

namespace {

// Runs a call without the GIL (a load, an object-store request: other Python threads go on).
py::object Invoke(const std::string& name, const Json& args) {
  Reply reply;
  Json value;
  {
    py::gil_scoped_release release;
    value = RunCall(name, args, reply);
  }
  return ToPython(value, reply);
}

// Python bytes as a call's argument, alive for the call.
Json BytesArg(const py::bytes& b) {
  std::string_view v = b;
  return Json{{"$address", reinterpret_cast<uintptr_t>(v.data())}, {"$bytes", v.size()}};
}

// zckpt._errors.for_kind (BindErrors); never freed, as the interpreter may outlive the module.
py::object* error_for_kind = nullptr;

}  // namespace

void BindErrors(py::object for_kind) {
  error_for_kind = new py::object(std::move(for_kind));
  py::register_local_exception_translator([](std::exception_ptr p) {  // this module's calls only
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      try {
        py::object exc = (*error_for_kind)(ErrorKindName(e.kind()), e.what(), ToPython(PlaceJson(e.place()), Reply{}));
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
      } catch (const py::error_already_set&) {  // the message alone, as an error cannot be lost
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
    }
  });
}

py::dict SaveStatsDict(const std::string& path, const SaveStats& s) { return ToPython(SaveStatsJson(path, s), Reply{}); }

void BindCommon(py::module_& m, py::class_<Container, std::shared_ptr<Container>>& checkpoint) {
  using Strings = std::vector<std::string>;
  checkpoint.def_property_readonly("path", &Container::path)
      .def("describe", [](const Container& c) { return ToPython(Describe(c), Reply{}); })
      .def("tensor_records", [](const Container& c) { return ToPython(TensorRecords(c), Reply{}); })
      .def("vetted_pickle", [](const Container& c, const Strings& allow) {
        std::string bytes;
        {
          py::gil_scoped_release release;
          bytes = VettedPickle(c, allow);
        }
        return py::bytes(bytes);
      }, py::arg("allow_globals") = Strings{});
  m.def("open", [](const std::string& path) {
    py::gil_scoped_release release;
    return std::shared_ptr<Container>(OpenContainer(path));
  }, py::arg("path"));
  m.def("describe", [](const std::string& path) { return Invoke("describe", {{"path", path}}); }, py::arg("path"));
  m.def("read_blob", [](const std::string& path, const std::string& name) {
    return Invoke("read_blob", {{"path", path}, {"name", name}});
  }, py::arg("path"), py::arg("name"));
  m.def("vetted_pickle", [](const std::string& path, const Strings& allow) {
    return Invoke("vetted_pickle", {{"path", path}, {"allow_globals", allow}});
  }, py::arg("path"), py::arg("allow_globals") = Strings{});
  m.def("tensor_records", [](const std::string& path) { return Invoke("tensor_records", {{"path", path}}); },
        py::arg("path"));
  m.def("convert", [](const std::string& src, const std::string& dst, uint64_t chunk_bytes, int zstd_level,
                      unsigned threads, const Strings& allow) {
    return Invoke("convert", {{"src", src}, {"dst", dst}, {"chunk_bytes", chunk_bytes}, {"zstd_level", zstd_level},
                              {"threads", threads}, {"allow_globals", allow}});
  }, py::arg("src"), py::arg("dst") = "", py::arg("chunk_bytes") = 0, py::arg("zstd_level") = 0,
        py::arg("threads") = 0, py::arg("allow_globals") = Strings{});
  m.def("export", [](const std::string& src, const std::string& dst, const std::string& format, const Strings& allow) {
    Invoke("export", {{"src", src}, {"dst", dst}, {"format", format}, {"allow_globals", allow}});
  }, py::arg("src"), py::arg("dst"), py::arg("format") = "pt", py::arg("allow_globals") = Strings{});
  m.def("verify", [](const std::string& path, std::optional<unsigned> threads) {
    return Invoke("verify", {{"path", path}, {"threads", threads ? Json(*threads) : Json(nullptr)}});
  }, py::arg("path"), py::arg("threads") = py::none());
  m.def("is_object_url", [](const std::string& p) { return Invoke("is_object_url", {{"path", p}}); }, py::arg("path"));
  m.def("object_exists", [](const std::string& url) { return Invoke("object_exists", {{"url", url}}); },
        py::arg("url"));
  m.def("is_object_folder", [](const std::string& url) { return Invoke("is_object_folder", {{"url", url}}); },
        py::arg("url"));
  m.def("list_objects", [](const std::string& url) {
    py::list out;
    for (auto entry : Invoke("list_objects", {{"folder_url", url}})) out.append(py::tuple(py::reinterpret_borrow<py::object>(entry)));
    return out;
  }, py::arg("folder_url"));
  m.def("read_object", [](const std::string& url, uint64_t max_bytes) {
    return Invoke("read_object", {{"url", url}, {"max_bytes", max_bytes}});
  }, py::arg("url"), py::arg("max_bytes") = uint64_t{1} << 30);
  m.def("write_object", [](const std::string& url, const py::bytes& data) {
    Invoke("write_object", {{"url", url}, {"data", BytesArg(data)}});
  }, py::arg("url"), py::arg("data"));
  m.def("read_regular_file", [](const std::string& path) { return Invoke("read_regular_file", {{"path", path}}); },
        py::arg("path"));
  m.def("write_file_atomically", [](const std::string& path, const py::bytes& data) {
    Invoke("write_file_atomically", {{"path", path}, {"data", BytesArg(data)}});
  }, py::arg("path"), py::arg("data"));
  m.def("copy_file_atomically", [](const std::string& src, const std::string& dst) {
    Invoke("copy_file_atomically", {{"src", src}, {"dst", dst}});
  }, py::arg("src"), py::arg("dst"));
}

}  // namespace zckpt::python
