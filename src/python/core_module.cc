// zckpt._core: the torch-free extension module. Everything of the `zckpt` package that needs no
// torch (convert, export, verify, describe, the object store) runs here, and so does every load:
// the Python layer allocates each storage or tensor (HostBuffer, or torch's own memory on the CPU
// or a CUDA device) and loader::LoadRanges fills byte ranges of storages through their addresses;
// a mapped load (mmap=True) hands out views of the file's copy-on-write mapping (MappedBytes);
// zckpt.save writes through save::SavePickledBytes (CUDA storages through its pinned ring). Built
// with Debian's pybind11 against the torch-free static layers only: `import zckpt._core` works
// where torch is not installed.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/cudart_loader.h"
#include "loader/host_load.h"
#include "save/save_pickled.h"
#include "python/core_functions.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/load_options.h"
#include "zckpt/load_ranges.h"

namespace py = pybind11;

namespace zckpt::python {
namespace {

// Host memory a load fills, owned by Python (zckpt/load_ranges.h's LoadBuffer on the host:
// 4 KiB-aligned, so bytes not in the page cache go straight from the disk into it): a writable
// buffer torch.frombuffer wraps without a copy, the tensor keeping it alive. Zero-filled is not
// promised: a load overwrites it.
using HostBuffer = LoadBuffer;

LoadOptions RingOptions(bool verify, std::optional<unsigned> threads, std::optional<unsigned> slots,
                        std::optional<uint64_t> slot_bytes) {
  LoadOptions o;
  o.verify = verify;
  o.threads = threads;
  o.slots = slots;
  o.slot_bytes = slot_bytes;
  return o;
}

// Every chunk of the open file checked (Container::Verify), for a weight iterator that must not
// hand out a first tensor from a file that is damaged further on: CorruptError listing every
// problem, each naming storage, tensors and byte range.
void VerifyChunks(const Container& c, std::optional<unsigned> threads) {
  VerifyReport report;
  {
    py::gil_scoped_release release;
    VerifyOptions options;
    options.threads = threads;
    report = c.Verify(options);
  }
  if (report.ok()) return;
  std::string msg = c.path() + ": verified before the first tensor was handed out: " +
                    std::to_string(report.problems.size()) + " problem(s):";
  for (const auto& p : report.problems) msg += "\n  " + p.message;
  throw Error(ErrorKind::kCorrupt, msg);
}

// LoadStats' figures of a load, as a dict.
py::dict LoadStatsDict(const LoadStats& s) {
  py::dict out;
  out["raw_bytes"] = s.raw_bytes;
  out["stored_bytes"] = s.stored_bytes;
  out["chunks"] = s.chunks;
  out["uncached_bytes"] = s.uncached_bytes;
  out["threads"] = s.threads;
  out["verified"] = s.verified;
  out["storages"] = s.storages;
  out["seconds"] = s.seconds;
  return out;
}

// Runs loader::LoadRanges without the GIL; its figures as a dict.
py::dict RunLoadRanges(const Container& c, const std::vector<LoadTarget>& ranges,
                       const std::vector<loader::CudaDevice>& devices, bool verify, std::optional<unsigned> threads,
                       std::optional<unsigned> slots, std::optional<uint64_t> slot_bytes) {
  LoadStats s;
  {
    py::gil_scoped_release release;
    s = loader::LoadRanges(c, ranges, RingOptions(verify, threads, slots, slot_bytes), devices);
  }
  return LoadStatsDict(s);
}

// (storage index, begin, end, address, device) per byte range, device -1 for host memory, else a
// CUDA device index whose stream the copies wait for is in `streams` (device -> cudaStream_t
// address: torch's current stream there, 0 for the legacy default stream). The Python layer
// allocates with torch and holds torch's device guard; the CUDA runtime is the one torch loaded.
py::dict LoadRangesDevice(const Container& c,
                          const std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uintptr_t, int32_t>>& targets,
                          const std::map<int32_t, uintptr_t>& streams, bool verify, std::optional<unsigned> threads,
                          std::optional<unsigned> slots, std::optional<uint64_t> slot_bytes) {
  std::vector<LoadTarget> ranges;
  ranges.reserve(targets.size());
  for (const auto& [storage, begin, end, address, device] : targets)
    ranges.push_back({storage, begin, end, reinterpret_cast<uint8_t*>(address), device});
  std::vector<loader::CudaDevice> devices;
  for (const auto& [index, stream] : streams)
    devices.push_back({index, reinterpret_cast<CUstream_st*>(stream)});
  return RunLoadRanges(c, ranges, devices, verify, threads, slots, slot_bytes);
}

// Bytes of one storage of a MappedStorages, which stays (mapped) while any view of it lives:
// torch.frombuffer over this aliases the file as torch.load(mmap=True) does.
class MappedBytes {
 public:
  MappedBytes(std::shared_ptr<const MappedStorages> m, uint32_t storage, uint64_t bytes)
      : mapped_(std::move(m)), data_(mapped_->data(storage)), bytes_(bytes) {}
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<const MappedStorages> mapped_;
  uint8_t* data_;
  uint64_t bytes_;
};

// key -> MappedBytes per storage (MappedStorages: raw chunks laid end to end alias the file, zstd
// chunks are decoded and checked; with verify, every mapped chunk is hashed where it lies first,
// on `threads` threads).
py::dict MapStorages(const Container& c, bool verify, std::optional<unsigned> threads) {
  std::shared_ptr<const MappedStorages> mapped;
  {
    py::gil_scoped_release release;
    mapped = std::make_shared<const MappedStorages>(c, verify, threads.value_or(DefaultReaderThreads()));
  }
  py::dict d;
  for (uint32_t s = 0; s < c.storage_count(); ++s) {
    StorageInfo info = c.storage(s);
    d[py::str(std::string(info.key))] = py::cast(MappedBytes(mapped, s, info.raw_bytes));
  }
  return d;
}

// zckpt.save: the pickle torch's pickler made, each storage by (address, bytes, device: -1 for
// host memory, else a CUDA device index) (the caller keeps them alive for the call), the
// archive's other records as torch's zip writer made them (zckpt/_save.py). CUDA storages go
// through the pinned ring of save/device_reader.h, its copies waiting for `streams`' stream on
// their device (device -> cudaStream_t address; the caller holds torch's device guard). Writes
// with the GIL released; returns SaveStats as a dict.
py::dict SavePickled(const std::string& path, const py::bytes& pickle,
                     const std::map<std::string, std::tuple<uintptr_t, uint64_t, int>>& storages,
                     const std::vector<std::string>& records_before, const std::vector<std::string>& records_after,
                     const std::map<std::string, py::bytes>& record_bytes, const std::string& prefix,
                     const std::map<std::string, std::string>& metadata, uint64_t chunk_bytes, int zstd_level,
                     unsigned threads, const std::map<int, uintptr_t>& streams) {
  save::PickledBytes checkpoint;
  checkpoint.pickle = pickle;
  for (const auto& [key, where] : storages) {
    const auto& [address, bytes, device] = where;
    checkpoint.storages[key] = {reinterpret_cast<const uint8_t*>(address), bytes, device};
  }
  checkpoint.records_before = records_before;
  checkpoint.records_after = records_after;
  for (const auto& [name, bytes] : record_bytes) checkpoint.record_bytes[name] = bytes;
  checkpoint.prefix = prefix;
  checkpoint.metadata = metadata;
  SaveOptions options;
  if (chunk_bytes) options.writer.chunk_bytes = chunk_bytes;
  options.writer.zstd_level = zstd_level;
  options.writer.threads = threads;
  SaveStats s;
  {
    py::gil_scoped_release release;
    s = save::SavePickledBytes(path, checkpoint, options, [&] {
      return save::MakeCudaReader(options.cuda_slots, options.cuda_slot_bytes, [&streams](int device) {
        auto it = streams.find(device);
        return it == streams.end() ? nullptr : reinterpret_cast<CUstream_st*>(it->second);
      });
    });
  }
  return SaveStatsDict(path, s);
}

// AsyncSaver's snapshot of CPU storages: (dst address, src address, bytes) triples copied with
// plain memcpy (torch's copy_ of uint8 runs a TensorIterator over OpenMP threads, measured ~3x
// slower than one memcpy on a busy machine), in pieces of 16 MiB spread over `threads` threads
// (0: one per core, at most 8), GIL released. The caller keeps both sides alive for the call.
void CopyHostBytes(const std::vector<std::tuple<uintptr_t, uintptr_t, uint64_t>>& copies, unsigned threads) {
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    size_t n;
  };
  constexpr size_t kPiece = 16u << 20;
  constexpr unsigned kMaxCopyThreads = 8;
  std::vector<Piece> pieces;
  for (const auto& [dst, src, n] : copies)
    for (size_t off = 0; off < n; off += kPiece)
      pieces.push_back({reinterpret_cast<uint8_t*>(dst) + off, reinterpret_cast<const uint8_t*>(src) + off,
                        std::min<size_t>(kPiece, n - off)});
  py::gil_scoped_release release;
  unsigned n = threads ? threads : std::min(kMaxCopyThreads, std::max(1u, std::thread::hardware_concurrency()));
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
}  // namespace zckpt::python

PYBIND11_MODULE(_core, m) {
  using zckpt::Container;
  using zckpt::python::HostBuffer;
  using zckpt::python::MappedBytes;
  m.doc() = "zckpt's torch-free core (use the `zckpt` package's functions)";
  py::object base = py::reinterpret_steal<py::object>(PyErr_NewException("zckpt.ZckptError", PyExc_RuntimeError, nullptr));
  if (!base) throw py::error_already_set();
  py::object corrupt = py::reinterpret_steal<py::object>(PyErr_NewException("zckpt.CorruptError", base.ptr(), nullptr));
  py::object unsafe = py::reinterpret_steal<py::object>(PyErr_NewException("zckpt.UnsafeError", base.ptr(), nullptr));
  // Host memory that cannot be had; `_C` makes it a torch.OutOfMemoryError too (SetOutOfMemoryClass).
  py::object oom = py::reinterpret_steal<py::object>(PyErr_NewException("zckpt.OutOfMemoryError", base.ptr(), nullptr));
  if (!corrupt || !unsafe || !oom) throw py::error_already_set();
  m.attr("ZckptError") = base;
  m.attr("CorruptError") = corrupt;
  m.attr("UnsafeError") = unsafe;
  m.attr("OutOfMemoryError") = oom;
  zckpt::python::BindErrors({base, corrupt, unsafe, oom});
  m.def("set_out_of_memory_error", &zckpt::python::SetOutOfMemoryClass, py::arg("cls"));
  m.def("copy_host_bytes", &zckpt::python::CopyHostBytes, py::arg("copies"), py::arg("threads") = 0);
  m.def("save_pickled", &zckpt::python::SavePickled, py::arg("path"), py::arg("pickle"), py::arg("storages"),
        py::arg("records_before"), py::arg("records_after"), py::arg("record_bytes"), py::arg("prefix"),
        py::arg("metadata"), py::arg("chunk_bytes") = 0, py::arg("zstd_level") = 0, py::arg("threads") = 0,
        py::arg("streams") = std::map<int, uintptr_t>{});

  py::class_<HostBuffer>(m, "HostBuffer", py::buffer_protocol(), py::module_local())
      .def(py::init([](uint64_t bytes) { return std::make_unique<HostBuffer>(bytes); }), py::arg("bytes"))
      .def_property_readonly("address", [](const HostBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def("__len__", &HostBuffer::bytes)
      .def_buffer([](HostBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.bytes())}, {1});
      });
  // module_local: `_C` registers the same C++ class; neither module sees the other's.
  py::class_<MappedBytes>(m, "MappedBytes", py::buffer_protocol(), py::module_local())
      .def("__len__", &MappedBytes::bytes)
      .def_buffer([](MappedBytes& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.bytes())}, {1});
      });
  // (path, version) of the CUDA runtime CUDA loads use (loaded now if it is not yet): torch's
  // libcudart when torch loaded one; version as cudaRuntimeGetVersion gives it (12080: 12.8).
  m.def("cuda_runtime", [] {
    const zckpt::CudaRuntime& rt = zckpt::Cuda();
    int version = 0;
    (void)rt.RuntimeGetVersion(&version);
    return py::make_tuple(rt.path, version);
  });
  py::class_<Container, std::shared_ptr<Container>> checkpoint(m, "Checkpoint", py::module_local());
  zckpt::python::BindCommon(m, checkpoint);
  zckpt::python::BindSharded(m);
  checkpoint.def("load_ranges", &zckpt::python::LoadRangesDevice, py::arg("targets"), py::arg("streams"),
           py::arg("verify") = true, py::arg("threads") = py::none(), py::arg("slots") = py::none(),
           py::arg("slot_bytes") = py::none())
      .def("verify_chunks", &zckpt::python::VerifyChunks, py::arg("threads") = py::none())
      .def("map_storages", &zckpt::python::MapStorages, py::arg("verify") = false, py::arg("threads") = py::none());
}
