// zckpt._C's saving functions (zckpt/_save.py holds the Python API): the GIL is released for
// the whole write, so an async save's background thread lets training run.
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <string>
#include <thread>
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

// AsyncSaver's snapshot of CPU storages: plain memcpy (torch's copy_ of uint8 runs a
// TensorIterator over OpenMP threads, measured ~3x slower than one memcpy on a busy machine),
// in pieces of 16 MiB spread over `threads` threads (0: one per core, at most 8), GIL released.
void CopyHostBytes(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs, unsigned threads) {
  if (dsts.size() != srcs.size()) throw Error(ErrorKind::kInvalidArgument, "copy_host_bytes: lists differ in length");
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    size_t n;
  };
  constexpr size_t kPiece = 16u << 20;
  std::vector<Piece> pieces;
  for (size_t i = 0; i < dsts.size(); ++i) {
    const at::Tensor& d = dsts[i];
    const at::Tensor& s = srcs[i];
    for (const at::Tensor* t : {&d, &s})
      if (!t->device().is_cpu() || t->scalar_type() != at::kByte || t->dim() != 1 || !t->is_contiguous())
        throw Error(ErrorKind::kInvalidArgument, "copy_host_bytes: CPU 1-D contiguous uint8 tensors only");
    if (d.numel() != s.numel()) throw Error(ErrorKind::kInvalidArgument, "copy_host_bytes: sizes differ");
    auto* dp = static_cast<uint8_t*>(d.data_ptr());
    const auto* sp = static_cast<const uint8_t*>(s.const_data_ptr());
    for (size_t off = 0; off < static_cast<size_t>(d.numel()); off += kPiece)
      pieces.push_back({dp + off, sp + off, std::min(kPiece, static_cast<size_t>(d.numel()) - off)});
  }
  py::gil_scoped_release release;
  unsigned n = threads ? threads : std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  n = static_cast<unsigned>(std::min<size_t>(n, pieces.size()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < n; ++t) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
}

}  // namespace

void BindSave(py::module_& m) {
  m.def("save_pickled", &SavePickledPy, py::arg("path"), py::arg("pickle"), py::arg("storages"), py::arg("records"),
        py::arg("prefix"), py::arg("metadata"), py::arg("chunk_bytes") = 0, py::arg("zstd_level") = 0,
        py::arg("threads") = 0, py::arg("cuda_slots") = 0, py::arg("cuda_slot_bytes") = 0);
  // zckpt::Save, the C++ trainers' API, reachable from Python for its tests.
  m.def("save_tensors", &SaveTensorsPy, py::arg("path"), py::arg("tensors"), py::arg("metadata"),
        py::arg("chunk_bytes") = 0, py::arg("zstd_level") = 0, py::arg("threads") = 0);
  m.def("copy_host_bytes", &CopyHostBytes, py::arg("dsts"), py::arg("srcs"), py::arg("threads") = 0);
}

}  // namespace zckpt
