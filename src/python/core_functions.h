// What the tests' torch module `zckpt._C` binds of the torch-free core: the calls of
// core_calls.h (one implementation, which the package reaches through libzckpt_core.so's C ABI)
// as pybind11 functions, and zckpt::Error as the package's error classes. Compiled against
// torch's bundled pybind11.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "python/core_calls.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/save_options.h"

namespace zckpt::python {

namespace py = pybind11;

// A call's JSON value as Python values: objects as dicts, arrays as lists, {"$bytes": i} as
// reply's bytes; PlaceJson's byte ranges as (begin, end) tuples.
py::object ToPython(const Json& value, const Reply& reply);

// Translates every zckpt::Error leaving this module into the error `for_kind(kind, message,
// place)` makes (zckpt/_errors.py: the class of its kind, ErrorKindName's, with PlaceJson's fields
// as attributes), as the package's _core raises it.
void BindErrors(py::object for_kind);

// What zckpt.save returns: `path` as "destination" and SaveStats' figures.
py::dict SaveStatsDict(const std::string& path, const SaveStats& s);

// The module functions and Checkpoint methods of the calls: open, describe, tensor_records,
// vetted_pickle, read_blob, convert, export, verify and the object-store helpers.
void BindCommon(py::module_& m, py::class_<Container, std::shared_ptr<Container>>& checkpoint);

}  // namespace zckpt::python
