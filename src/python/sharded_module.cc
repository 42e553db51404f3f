// zckpt._C, the parts sharded checkpoints stand on. For torch.distributed.checkpoint's storage
// layer (zckpt/dcp.py): a container writer fed from Python (tensors on any device, streamed out
// in pieces), a loader of boxes of saved tensors into destination tensors (LoadRegions), a
// container's storage -> tensors map, `.metadata` and BytesIO vetting by zckpt's interpreter.
// For zckpt/reshard.py: MergeCheckpoint. Registered from module.cc's PYBIND11_MODULE.
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "common/shape.h"
#include "checkpoint/dcp_layout.h"
#include "checkpoint/folder.h"
#include "checkpoint/storage_stream.h"
#include "loader/tensors.h"
#include "pickle/dcp_metadata.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/error.h"
#include "zckpt/load_regions.h"
#include "zckpt/merge.h"

namespace py = pybind11;

namespace zckpt {
namespace {

// Device and non-contiguous tensors go out in pieces of this many bytes: a host copy of one
// piece at a time, never of the whole tensor.
constexpr uint64_t kPieceBytes = 64ull << 20;

// zckpt's dtype code of a torch dtype (the inverse of loader::ToScalarType).
DType FromScalarType(c10::ScalarType st) {
  static const std::map<c10::ScalarType, DType> table = [] {
    std::map<c10::ScalarType, DType> m;
    for (uint16_t code = 1; code <= kMaxDTypeCode; ++code) {
      try {
        m.emplace(loader::ToScalarType(static_cast<DType>(code), ""), static_cast<DType>(code));
      } catch (const Error&) {  // a dtype this torch lacks
      }
    }
    return m;
  }();
  auto it = table.find(st);
  if (it == table.end())
    throw Error(ErrorKind::kUnsupported, std::string("dtype ") + c10::toString(st) + " has no zckpt dtype code");
  return it->second;
}

// A ContainerWriter driven from Python. Every call that writes releases the GIL.
class PyContainerWriter {
 public:
  PyContainerWriter(const std::string& path, uint64_t chunk_bytes, int zstd_level, unsigned threads) {
    WriterOptions o;
    if (chunk_bytes) o.chunk_bytes = chunk_bytes;
    o.zstd_level = zstd_level;
    o.threads = threads;
    writer_ = std::make_unique<ContainerWriter>(path, o);
  }

  // One storage `key` holding the tensor's elements in row-major order, and a tensor record
  // `name` viewing all of it (contiguous). `t` may live on any device and have any strides.
  void AddTensor(const std::string& key, const std::string& name, const at::Tensor& tensor, const std::string& extra) {
    at::Tensor t = tensor.detach();
    if (t.is_conj()) t = t.resolve_conj();
    if (t.is_neg()) t = t.resolve_neg();
    DType dtype = FromScalarType(t.scalar_type());
    NewTensor nt;
    nt.name = name;
    nt.dtype = dtype;
    nt.shape = t.sizes().vec();
    nt.stride = ContiguousStrides(nt.shape);
    nt.extra = extra;
    py::gil_scoped_release release;
    loader::WithTorchErrors([&] {
      if (!t.is_contiguous()) t = t.contiguous();
      const uint64_t item = t.element_size();
      const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * item;
      NewStorage ns{key, t.device().str(), dtype, false};
      if (t.is_cpu()) {
        nt.storage = writer_->AddStorage(ns, {static_cast<const uint8_t*>(t.data_ptr()), nbytes});
      } else {
        nt.storage = writer_->BeginStorage(ns, nbytes);
        at::Tensor flat = t.reshape({-1});
        const int64_t per_piece = static_cast<int64_t>(std::max<uint64_t>(1, kPieceBytes / item));
        for (int64_t e = 0; e < flat.numel(); e += per_piece) {
          at::Tensor host = flat.narrow(0, e, std::min(per_piece, flat.numel() - e)).to(c10::kCPU);
          writer_->AppendStorage({static_cast<const uint8_t*>(host.data_ptr()), host.numel() * item});
        }
        writer_->EndStorage();
      }
    });
    writer_->AddTensor(nt);
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
  std::unique_ptr<ContainerWriter> writer_;
};

using PyRegion = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, at::Tensor>;

py::dict LoadRegionsPy(const std::string& path, const std::vector<PyRegion>& regions, bool verify) {
  std::vector<Region> rs;
  rs.reserve(regions.size());
  for (const auto& [name, offsets, lengths, target] : regions) rs.push_back(Region{name, offsets, lengths, target});
  LoadRegionsReport r;
  {
    py::gil_scoped_release release;
    LoadOptions o;
    o.verify = verify;
    r = LoadRegions(path, rs, o);
  }
  py::dict out;
  out["regions"] = r.regions;
  out["direct"] = r.direct;
  out["staged"] = r.staged;
  out["stored_bytes"] = r.stats.stored_bytes;
  out["raw_bytes"] = r.stats.raw_bytes;
  out["chunks"] = r.stats.chunks;
  return out;
}

// storage key -> names of the tensor records viewing it, in table order. The GIL is released
// while the container is opened (an object's HEAD and index GETs), as by every other reader.
std::map<std::string, std::vector<std::string>> StorageTensors(const std::string& path) {
  py::gil_scoped_release release;
  auto c = Container::Open(path);
  std::map<std::string, std::vector<std::string>> out;
  for (uint32_t s = 0; s < c->storage_count(); ++s) {
    auto& names = out[std::string(c->storage(s).key)];
    for (uint32_t t : c->TensorsOfStorage(s)) names.emplace_back(c->tensor(t).name);
  }
  return out;
}

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

void RegisterSharded(py::module_& m) {
  py::class_<PyContainerWriter>(m, "ContainerWriter")
      .def(py::init<const std::string&, uint64_t, int, unsigned>(), py::arg("path"), py::arg("chunk_bytes") = 0,
           py::arg("zstd_level") = 0, py::arg("threads") = 0)
      .def("add_tensor", &PyContainerWriter::AddTensor, py::arg("key"), py::arg("name"), py::arg("tensor"),
           py::arg("extra") = "")
      .def("add_blob", &PyContainerWriter::AddBlob, py::arg("name"), py::arg("data"))
      .def("set_metadata", &PyContainerWriter::SetMetadata, py::arg("key"), py::arg("value"))
      .def("commit", &PyContainerWriter::Commit);
  m.def("load_regions", &LoadRegionsPy, py::arg("path"), py::arg("regions"), py::arg("verify") = true);
  m.def("storage_tensors", &StorageTensors, py::arg("path"));
  m.def("check_dcp_metadata", &CheckDcpMetadata, py::arg("data"), py::arg("what"));
  m.def("read_dcp_blobs", &ReadDcpBlobs, py::arg("path"), py::arg("names"),
        py::arg("allow_globals") = std::vector<std::string>{});
  m.def("fsdp1_layout", &Fsdp1Layout, py::arg("dir"), py::arg("files"));
  m.def("merge", &Merge, py::arg("dir"), py::arg("out"), py::arg("files") = "model", py::arg("keys") = "");
}

}  // namespace zckpt
