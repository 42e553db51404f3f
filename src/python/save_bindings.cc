// zckpt._C's saving functions (zckpt/_save.py holds the Python API): the GIL is released for
// the whole write, so an async save's background thread lets training run.
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "python/core_functions.h"
#include "zckpt/error.h"
#include "zckpt/save.h"

namespace py = pybind11;

namespace zckpt {
namespace {

SaveOptions MakeOptions(uint64_t chunk_bytes, int zstd_level, unsigned threads, unsigned cuda_slots,
                        uint64_t cuda_slot_bytes) {
  SaveOptions options;
  if (chunk_bytes) options.writer.chunk_bytes = chunk_bytes;
  options.writer.zstd_level = zstd_level;
  options.writer.threads = threads;
  if (cuda_slots) options.cuda_slots = cuda_slots;
  if (cuda_slot_bytes) options.cuda_slot_bytes = cuda_slot_bytes;
  return options;
}

py::dict SavePickledPy(const std::string& path, const py::bytes& pickle, const std::map<std::string, at::Tensor>& storages,
                       const std::vector<std::pair<std::string, py::bytes>>& records, const std::string& prefix,
                       const std::map<std::string, std::string>& metadata, uint64_t chunk_bytes, int zstd_level,
                       unsigned threads, unsigned cuda_slots, uint64_t cuda_slot_bytes) {
  PickledCheckpoint checkpoint;
  checkpoint.pickle = pickle;
  checkpoint.storages = storages;
  for (const auto& [name, bytes] : records) checkpoint.records.emplace_back(name, std::string(bytes));
  checkpoint.prefix = prefix;
  checkpoint.metadata = metadata;
  SaveOptions options = MakeOptions(chunk_bytes, zstd_level, threads, cuda_slots, cuda_slot_bytes);
  SaveStats stats;
  {
    py::gil_scoped_release release;
    stats = SavePickled(path, checkpoint, options);
  }
  return python::SaveStatsDict(path, stats);
}

py::dict SaveTensorsPy(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata, uint64_t chunk_bytes, int zstd_level,
                       unsigned threads) {
  SaveOptions options = MakeOptions(chunk_bytes, zstd_level, threads, 0, 0);
  SaveStats stats;
  {
    py::gil_scoped_release release;
    stats = Save(path, tensors, metadata, options);
  }
  return python::SaveStatsDict(path, stats);
}

}  // namespace

void BindSave(py::module_& m) {
  m.def("save_pickled", &SavePickledPy, py::arg("path"), py::arg("pickle"), py::arg("storages"), py::arg("records"),
        py::arg("prefix"), py::arg("metadata"), py::arg("chunk_bytes") = 0, py::arg("zstd_level") = 0,
        py::arg("threads") = 0, py::arg("cuda_slots") = 0, py::arg("cuda_slot_bytes") = 0);
  // zckpt::Save, the C++ trainers' API, reachable from Python for its tests.
  m.def("save_tensors", &SaveTensorsPy, py::arg("path"), py::arg("tensors"), py::arg("metadata"),
        py::arg("chunk_bytes") = 0, py::arg("zstd_level") = 0, py::arg("threads") = 0);
}

}  // namespace zckpt
