#include "loader/copy_views.h"

#include <c10/core/GradMode.h>

#include <algorithm>

#include "loader/plan.h"
#include "loader/stream.h"
#include "loader/tensors.h"
#include "loader/torch_cuda.h"
#include "zckpt/format.h"

namespace zckpt::loader {

namespace {

// A view whose bytes go through a host staging buffer.
struct Staged {
  at::Tensor target;
  TensorInfo info;
  at::Tensor buffer;  // allocated when its first bytes arrive, freed once copied
};

// zckpt's name of `st`, or c10's own for a type zckpt has no code for.
std::string DTypeNameOf(c10::ScalarType st) {
  for (uint16_t code = 1; code <= kMaxDTypeCode; ++code) {
    if (!IsValidDType(code)) continue;
    const auto d = static_cast<DType>(code);
    try {
      if (ToScalarType(d, "") == st) return std::string(DTypeName(d));
    } catch (const Error&) {  // not in this torch
    }
  }
  return c10::toString(st);
}

}  // namespace

TargetFacts FactsOf(const std::string& name, const at::Tensor& target) {
  TargetFacts f;
  f.name = name;
  f.strided = target.layout() == c10::kStrided;
  f.device = target.device().str();
  f.has_storage = target.has_storage() && !(target.numel() > 0 && target.data_ptr() == nullptr);
  f.dtype = DTypeNameOf(target.scalar_type());
  f.shape = target.sizes().vec();
  return f;
}

std::string TargetProblem(const std::string& name, const at::Tensor& target) {
  if (!target.defined()) return "target '" + name + "' is an undefined tensor";
  return TargetProblem(FactsOf(name, target));
}

bool SavedContiguous(const TensorInfo& t) {
  if (t.flags & (format::kTensorConj | format::kTensorNeg)) return false;
  int64_t expected = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] != 1 && t.stride[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

std::string DTypeProblem(const TensorInfo& t, const std::string& name, const at::Tensor& target) {
  try {
    (void)ToScalarType(t.dtype, "'" + name + "'");
  } catch (const Error& e) {
    return e.what();
  }
  return DTypeProblem(t, FactsOf(name, target));
}

ViewCopyReport CopyViews(const Container& c, std::vector<ViewCopy> copies, const LoadOptions& options,
                         std::chrono::steady_clock::time_point t0) {
  ViewCopyReport report;
  report.copies = copies.size();
  const uint64_t chunk_bytes = c.superblock().chunk_bytes;
  std::vector<std::pair<uint64_t, Piece>> pieces;
  std::vector<Staged> staged;
  std::vector<uint64_t> staged_bytes;
  std::vector<int> cuda_devices;
  std::vector<at::Tensor> direct_targets;
  for (ViewCopy& copy : copies) {
    const at::Tensor& dst = copy.target;
    const TensorInfo& info = copy.view;
    if (info.byte_end == info.byte_begin) continue;  // no elements
    int dev = dst.is_cuda() ? dst.get_device() : -1;
    if (dev >= 0 && std::find(cuda_devices.begin(), cuda_devices.end(), dev) == cuda_devices.end())
      cuda_devices.push_back(dev);
    std::string what = "tensor ";
    what.append(info.name);
    bool same_dtype = ToScalarType(info.dtype, what) == dst.scalar_type();
    bool direct = same_dtype && SavedContiguous(info) && dst.is_contiguous() && !dst.is_conj() && !dst.is_neg();
    auto* base = static_cast<uint8_t*>(dst.data_ptr());
    int32_t id = -1;
    if (direct) {
      ++report.direct;
      direct_targets.push_back(dst);
    } else {
      ++report.staged;
      id = static_cast<int32_t>(staged.size());
      staged.push_back(Staged{dst, info, at::Tensor()});
      staged_bytes.push_back(info.byte_end - info.byte_begin);
    }
    StorageInfo s = c.storage(info.storage);
    for (uint64_t k = info.byte_begin / chunk_bytes; k * chunk_bytes < info.byte_end; ++k) {
      uint64_t chunk_begin = k * chunk_bytes;
      uint64_t lo = std::max(chunk_begin, info.byte_begin);
      uint64_t hi = std::min({chunk_begin + chunk_bytes, s.raw_bytes, info.byte_end});
      Piece p;
      p.chunk_offset = lo - chunk_begin;
      p.bytes = hi - lo;
      p.device = dev;
      if (direct) p.dst = base + (lo - info.byte_begin);
      p.staged = id;
      p.staged_offset = lo - info.byte_begin;
      pieces.emplace_back(s.first_chunk + k, p);
    }
  }
  Destinations d(c.chunk_count(), std::move(pieces));
  d.staged_bytes = std::move(staged_bytes);

  StagingHooks hooks;
  hooks.buffer = [&](uint32_t id) {
    Staged& s = staged[id];
    if (!s.buffer.defined()) s.buffer = AllocateBytes(s.info.byte_end - s.info.byte_begin, c10::Device(c10::kCPU));
    return static_cast<uint8_t*>(s.buffer.data_ptr());
  };
  hooks.complete = [&](uint32_t id) {
    Staged& s = staged[id];
    uint32_t item = DTypeSize(s.info.dtype);
    auto offset = static_cast<int64_t>(s.info.storage_offset - s.info.byte_begin / item);
    WithTorchErrors([&] {
      at::Tensor src = MakeView(s.buffer.storage(), s.info, offset);
      c10::NoGradGuard no_grad;  // as load_state_dict: an in-place copy into a leaf
      s.target.copy_(src);
    });
    s.buffer = at::Tensor();
  };
  report.stats = StreamChunksForTorch(c, d, options, cuda_devices, hooks);
  // Bytes written behind autograd's back: bump the version counters as copy_ would have.
  for (const at::Tensor& t : direct_targets)
    if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
  report.stats.storages = c.storage_count();
  report.stats.tensors = report.copies;
  report.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace zckpt::loader
