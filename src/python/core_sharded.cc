// zckpt._core, the parts sharded checkpoints stand on, torch-free. For torch.distributed.checkpoint's
// storage layer (zckpt/dcp.py): a container writer fed host bytes by address (zckpt/_writer.py
// copies device and non-contiguous tensors out in pieces), `.metadata` and BytesIO vetting by
// zckpt's interpreter, and the object-pickle check a region load makes (zckpt/_regions.py reads
// the boxes through Checkpoint.load_ranges_host). For zckpt/reshard.py: MergeCheckpoint and the
// FSDP1 flat-optimizer layout. Registered from core_module.cc's PYBIND11_MODULE.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/dcp_layout.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/storage_stream.h"
#include "common/shape.h"
#include "pickle/dcp_metadata.h"
#include "python/core_functions.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/dtype.h"
#include "zckpt/error.h"
#include "zckpt/merge.h"

namespace zckpt::python {
namespace {

// Host memory the caller owns and keeps alive for the call, as a byte span.
std::span<const uint8_t> HostBytes(uintptr_t address, uint64_t bytes) {
  if (bytes != 0 && address == 0)
    throw Error(ErrorKind::kInvalidArgument, "a null address for " + std::to_string(bytes) + " bytes");
  return {reinterpret_cast<const uint8_t*>(address), static_cast<size_t>(bytes)};
}

// A ContainerWriter driven from Python with host bytes. A tensor is one storage `key` holding its
// elements in row-major order and a record `name` viewing all of it; `dtype` is zckpt's name of
// it (torch's, zckpt/_into_host.py:dtype_name), `location` the device it was saved from. Every
// call that writes releases the GIL.
class PyContainerWriter {
 public:
  PyContainerWriter(const std::string& path, uint64_t chunk_bytes, int zstd_level, unsigned threads) {
    WriterOptions o;
    if (chunk_bytes) o.chunk_bytes = chunk_bytes;
    o.zstd_level = zstd_level;
    o.threads = threads;
    writer_ = std::make_unique<ContainerWriter>(path, o);
  }

  // A contiguous host tensor whole: `bytes` at `address`.
  void AddTensor(const std::string& key, const std::string& name, const std::string& dtype,
                 const std::vector<int64_t>& shape, uintptr_t address, uint64_t bytes, const std::string& extra,
                 const std::string& location) {
    NewTensor t = Record(name, dtype, shape, bytes, extra);
    std::span<const uint8_t> data = HostBytes(address, bytes);
    {
      py::gil_scoped_release release;
      t.storage = writer_->AddStorage(NewStorage{key, location, t.dtype, false}, data);
    }
    writer_->AddTensor(t);
  }

  // A tensor in pieces: begin_tensor, append_bytes until `bytes` are given, end_tensor. One at a
  // time, no blob in between (ContainerWriter::BeginStorage).
  void BeginTensor(const std::string& key, const std::string& name, const std::string& dtype,
                   const std::vector<int64_t>& shape, uint64_t bytes, const std::string& extra,
                   const std::string& location) {
    NewTensor t = Record(name, dtype, shape, bytes, extra);
    t.storage = writer_->BeginStorage(NewStorage{key, location, t.dtype, false}, bytes);
    writer_->AddTensor(t);
  }

  void AppendBytes(uintptr_t address, uint64_t bytes) {
    std::span<const uint8_t> data = HostBytes(address, bytes);
    py::gil_scoped_release release;
    writer_->AppendStorage(data);
  }

  void EndTensor() {
    py::gil_scoped_release release;
    writer_->EndStorage();
  }

  void AddBlob(const std::string& name, const py::bytes& data) {
    std::string_view v = data;  // pybind11: a view of the bytes object, which `data` keeps alive
    py::gil_scoped_release release;
    writer_->AddBlob(name, {reinterpret_cast<const uint8_t*>(v.data()), v.size()});
  }

  void SetMetadata(const std::string& key, const std::string& value) { writer_->SetMetadata(key, value); }

  py::dict Commit() {
    WriterStats s;
    {
      py::gil_scoped_release release;
      s = writer_->Commit();
    }
    py::dict out;
    out["storages"] = s.storages;
    out["chunks"] = s.chunks;
    out["raw_bytes"] = s.raw_bytes;
    out["file_bytes"] = s.file_bytes;
    return out;
  }

 private:
  // The record of a contiguous tensor; its byte count must be the shape's (a caller's slip would
  // otherwise surface only at Commit).
  static NewTensor Record(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                          uint64_t bytes, const std::string& extra) {
    std::optional<DType> code = DTypeFromName(dtype);
    if (!code) throw Error(ErrorKind::kUnsupported, "dtype " + dtype + " has no zckpt dtype code");
    uint64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0) throw Error(ErrorKind::kInvalidArgument, "tensor '" + name + "': a negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * DTypeSize(*code) != bytes)
      throw Error(ErrorKind::kInvalidArgument, "tensor '" + name + "': " + std::to_string(bytes) + " bytes for " +
                                                   std::to_string(numel) + " elements of " + dtype);
    NewTensor t;
    t.name = name;
    t.dtype = *code;
    t.shape = shape;
    t.stride = ContiguousStrides(shape);
    t.extra = extra;
    return t;
  }

  std::unique_ptr<ContainerWriter> writer_;
};

// Reads `.metadata` bytes with zckpt's interpreter (nothing runs): raises UnsafeError for a
// global outside DCP's metadata classes, CorruptError when it is not DCP metadata. Returns the
// number of (items, storage entries).
std::pair<size_t, size_t> CheckDcpMetadata(const py::bytes& data, const std::string& what) {
  std::string_view v = data;
  pickle::DcpMetadata md = pickle::ReadDcpMetadata({reinterpret_cast<const uint8_t*>(v.data()), v.size()}, what);
  return {md.items.size(), md.storage.size()};
}

// The blobs `names` of a container, each checked against its XXH3 and vetted as a torch.save
// archive by zckpt's interpreter (DCP's planner unpickles them with weights_only=False).
std::vector<py::bytes> ReadDcpBlobs(const std::string& path, const std::vector<std::string>& names,
                                    const std::vector<std::string>& allow_globals) {
  checkpoint::PickleReadOptions read;  // DCP's planner unpickles them next: the allowlist
  read.allow_globals = allow_globals;
  std::vector<std::vector<uint8_t>> blobs;
  {
    // Without the GIL while reading (an object's ranged GETs): other Python threads run on.
    py::gil_scoped_release release;
    auto c = Container::Open(path);
    for (const std::string& name : names) {
      auto bytes = checkpoint::CheckedBlob(*c, name, "the folder's .metadata");
      dcp::VetTorchSaveBytes(bytes, path + " blob '" + name + "'", read);
      blobs.push_back(std::move(bytes));
    }
  }
  std::vector<py::bytes> out;
  for (const auto& bytes : blobs) out.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return out;
}

// A region load reads raw bytes only, yet a container with an object pickle must hold one that
// zckpt's interpreter accepts and that agrees with the index, as for every other load (none in
// DCP's own containers: nothing to check there).
void CheckObjectPickle(const Container& c, const std::vector<std::string>& allow_globals) {
  checkpoint::PickleReadOptions read;
  read.allow_globals = allow_globals;
  py::gil_scoped_release release;
  (void)checkpoint::ReadObjectPickle(c, read);
}

py::dict Merge(const std::string& dir, const std::string& out, const std::string& files, const std::string& keys) {
  MergeOptions o;
  o.files = files;
  o.keys = keys;
  MergeStats s;
  {
    py::gil_scoped_release release;
    s = MergeCheckpoint(dir, out, o);
  }
  py::dict d;
  d["layout"] = s.layout;
  d["tensors"] = s.tensors;
  d["bytes"] = s.bytes;
  d["largest_tensor"] = s.largest_tensor;
  d["written"] = s.written;
  return d;
}

// FSDP1 flat optimizer files' FlatParameter layout as JSON ("" when they are not such files).
std::string Fsdp1Layout(const std::string& dir, const std::string& files) {
  MergeOptions o;
  o.files = files;
  py::gil_scoped_release release;
  return Fsdp1OptimLayout(dir, o);
}

}  // namespace

void BindSharded(py::module_& m) {
  py::class_<PyContainerWriter>(m, "ContainerWriter", py::module_local())
      .def(py::init<const std::string&, uint64_t, int, unsigned>(), py::arg("path"), py::arg("chunk_bytes") = 0,
           py::arg("zstd_level") = 0, py::arg("threads") = 0)
      .def("add_tensor", &PyContainerWriter::AddTensor, py::arg("key"), py::arg("name"), py::arg("dtype"),
           py::arg("shape"), py::arg("address"), py::arg("bytes"), py::arg("extra") = "", py::arg("location") = "cpu")
      .def("begin_tensor", &PyContainerWriter::BeginTensor, py::arg("key"), py::arg("name"), py::arg("dtype"),
           py::arg("shape"), py::arg("bytes"), py::arg("extra") = "", py::arg("location") = "cpu")
      .def("append_bytes", &PyContainerWriter::AppendBytes, py::arg("address"), py::arg("bytes"))
      .def("end_tensor", &PyContainerWriter::EndTensor)
      .def("add_blob", &PyContainerWriter::AddBlob, py::arg("name"), py::arg("data"))
      .def("set_metadata", &PyContainerWriter::SetMetadata, py::arg("key"), py::arg("value"))
      .def("commit", &PyContainerWriter::Commit);
  m.def("check_dcp_metadata", &CheckDcpMetadata, py::arg("data"), py::arg("what"));
  m.def("read_dcp_blobs", &ReadDcpBlobs, py::arg("path"), py::arg("names"),
        py::arg("allow_globals") = std::vector<std::string>{});
  m.def("check_object_pickle", &CheckObjectPickle, py::arg("checkpoint"),
        py::arg("allow_globals") = std::vector<std::string>{});
  m.def("fsdp1_layout", &Fsdp1Layout, py::arg("dir"), py::arg("files"));
  m.def("merge", &Merge, py::arg("dir"), py::arg("out"), py::arg("files") = "model", py::arg("keys") = "");
}

}  // namespace zckpt::python
