// What both extension modules bind from one source: the torch-free `zckpt._core` and the torch
// one, `zckpt._C`, which keeps the same names for its callers. Compiled into each module against
// that module's pybind11 (Debian's for `_core`, torch's bundled one for `_C`), so nothing of
// pybind11 crosses between them: Python objects only. The error classes are `_core`'s; `_C`
// raises those same classes (BindErrors with the classes it imports from `_core`).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/save_options.h"

namespace zckpt::python {

namespace py = pybind11;

// Container::Open with the GIL released, its "not a container" error hinting at `zckpt convert`.
std::unique_ptr<Container> OpenContainer(const std::string& path);

// Where an error lies (ErrorPlace) as Python values: {"file", "storage", "tensors" (a list),
// "chunk", "file_bytes", "storage_bytes" ((begin, end) tuples)}, None for what it is not about.
py::dict PlaceFields(const ErrorPlace& place);

// The Python classes zckpt::Error becomes, by kind.
struct ErrorClasses {
  py::object base, corrupt, unsafe, oom;
};
// Translates every zckpt::Error leaving this module into its class, with PlaceFields as attributes.
void BindErrors(const ErrorClasses& classes);
// From now on this module raises `cls` for kOutOfMemory: `_core`'s own class is torch-free, and
// once `_C` is loaded it hands `_core` its subclass that is also a torch.OutOfMemoryError, so
// resume code catches an out-of-memory error from either module as it catches torch's own.
void SetOutOfMemoryClass(const py::object& cls);

// What zckpt.save returns: `path` as "destination" and SaveStats' figures.
py::dict SaveStatsDict(const std::string& path, const SaveStats& s);

// The module functions and Checkpoint methods both modules have: describe, tensor_records,
// vetted_pickle, read_blob, convert, export, verify and the object-store helpers.
void BindCommon(py::module_& m, py::class_<Container, std::shared_ptr<Container>>& checkpoint);

// `_core` only (core_sharded.cc): what zckpt.dcp and zckpt.reshard need, the container writer fed
// host bytes, DCP metadata and BytesIO vetting, merge and the FSDP1 flat-optimizer layout.
void BindSharded(py::module_& m);

}  // namespace zckpt::python
