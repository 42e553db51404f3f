// LoadInto: the file's tensors copied in place into existing tensors, matched by name.
#include <algorithm>
#include <chrono>
#include <optional>
#include <sstream>

#include "loader/copy_views.h"
#include "loader/plan.h"
#include "loader/stream.h"
#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/format.h"
#include "zckpt/loader.h"

namespace zckpt {

namespace {

using Targets = std::vector<std::pair<std::string, at::Tensor>>;

std::string Shape(c10::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

std::string Quoted(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

// Why `target` cannot be written in place at all, or "" when it can.
std::string TargetProblem(const std::string& name, const at::Tensor& target) {
  if (!target.defined()) return "target '" + name + "' is an undefined tensor";
  // Wrapper subclasses (DTensor) have no storage of their own: writing through their
  // data_ptr() would write to nothing. Their local tensor is the target.
  if (!target.has_storage() || (target.numel() > 0 && target.data_ptr() == nullptr))
    return "target '" + name + "' has no storage of its own (a tensor subclass such as DTensor: pass its local tensor)";
  if (target.layout() != c10::kStrided) return "target '" + name + "' is not a dense (strided) tensor";
  if (!target.is_cpu() && !target.is_cuda())
    return "target '" + name + "' is on " + target.device().str() + ": only cpu and cuda targets are supported";
  return "";
}

// Why the file's dtype `t.dtype` cannot go into `target`'s, or "".
std::string DTypeProblem(const TensorInfo& t, const std::string& name, const at::Tensor& target) {
  c10::ScalarType st;
  try {
    st = loader::ToScalarType(t.dtype, "'" + name + "'");
  } catch (const Error& e) {
    return e.what();
  }
  if (st != target.scalar_type())
    return "dtype mismatch for '" + name + "': the file has " + std::string(DTypeName(t.dtype)) + ", the target has " +
           std::string(c10::toString(target.scalar_type()));
  if (c10::isQIntType(st) || (t.flags & format::kTensorQuantized))
    return "'" + name + "' is quantized: not supported by LoadInto";
  return "";
}

// Why `target` cannot take `t`, or "" when it can.
std::string Mismatch(const TensorInfo& t, const std::string& name, const at::Tensor& target) {
  if (std::string why = TargetProblem(name, target); !why.empty()) return why;
  if (std::string why = DTypeProblem(t, name, target); !why.empty()) return why;
  if (c10::IntArrayRef(t.shape) != target.sizes())
    return "size mismatch for '" + name + "': the file has shape " + Shape(t.shape) + ", the target has shape " +
           Shape(target.sizes());
  return "";
}

// The pieces carrying storage bytes [begin, end) of `s`, chunk by chunk: to `dst` (direct) or to
// staging buffer `staged` (dst unused).
void AddPieces(const StorageInfo& s, uint64_t chunk_bytes, uint64_t begin, uint64_t end, uint8_t* dst, int device,
               int32_t staged, std::vector<std::pair<uint64_t, loader::Piece>>& pieces) {
  for (uint64_t k = begin / chunk_bytes; k * chunk_bytes < end; ++k) {
    uint64_t chunk_begin = k * chunk_bytes;
    uint64_t lo = std::max(chunk_begin, begin);
    uint64_t hi = std::min({chunk_begin + chunk_bytes, s.raw_bytes, end});
    loader::Piece p;
    p.chunk_offset = lo - chunk_begin;
    p.bytes = hi - lo;
    p.device = device;
    if (staged < 0) p.dst = dst + (lo - begin);
    p.staged = staged;
    p.staged_offset = lo - begin;
    pieces.emplace_back(s.first_chunk + k, p);
  }
}

// Bytes written behind autograd's back: bump the version counters as copy_ would have.
void BumpVersions(const std::vector<at::Tensor>& written) {
  for (const at::Tensor& t : written)
    if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

void NoteDevice(const at::Tensor& t, std::vector<int>& cuda_devices) {
  int dev = t.is_cuda() ? t.get_device() : -1;
  if (dev >= 0 && std::find(cuda_devices.begin(), cuda_devices.end(), dev) == cuda_devices.end())
    cuda_devices.push_back(dev);
}

}  // namespace

LoadIntoReport LoadInto(const std::string& path, const Targets& targets, const LoadIntoOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  auto c = Container::Open(path);
  loader::ResolveSlotBytes(options.base, c->superblock().chunk_bytes);
  // One container, one answer: the pickle must describe what the index does (zckpt.load reads
  // the pickle) before any target is written.
  (void)loader::VetObjectPickle(*c, options.base.allow_globals);
  LoadIntoReport report;

  // Match by name; check every match before anything is written.
  std::vector<std::pair<const std::pair<std::string, at::Tensor>*, TensorInfo>> matched;
  std::vector<bool> wanted(c->tensor_count(), false);
  std::vector<std::string> problems;
  for (const auto& target : targets) {
    std::optional<uint32_t> i = c->FindTensor(target.first);
    if (!i) {
      report.missing.push_back(target.first);
      continue;
    }
    wanted[*i] = true;
    TensorInfo info = c->tensor(*i);
    std::string why = Mismatch(info, target.first, target.second);
    if (!why.empty()) problems.push_back(why);
    matched.emplace_back(&target, std::move(info));
  }
  // Internal tensors (a DTensor's DeviceMesh) are not state entries: never "unexpected".
  for (uint32_t i = 0; i < c->tensor_count(); ++i)
    if (!wanted[i] && !(c->tensor(i).flags & format::kTensorInternal)) report.unexpected.emplace_back(c->tensor(i).name);
  if (options.strict && (!report.missing.empty() || !report.unexpected.empty())) {
    std::string keys;
    if (!report.missing.empty()) keys = "Missing key(s): " + Quoted(report.missing);
    if (!report.unexpected.empty()) keys += (keys.empty() ? "" : "; ") + ("Unexpected key(s): " + Quoted(report.unexpected));
    problems.push_back(keys);
  }
  if (!problems.empty()) {
    std::string msg = "cannot load " + path + " into the given tensors:";
    for (const auto& p : problems) msg += "\n  " + p;
    throw Error(ErrorKind::kInvalidArgument, msg);
  }

  std::vector<loader::ViewCopy> copies;
  copies.reserve(matched.size());
  for (auto& [target, info] : matched) copies.push_back(loader::ViewCopy{target->second, std::move(info)});
  report.tensors_copied = copies.size();
  loader::ViewCopyReport r = loader::CopyViews(*c, std::move(copies), options.base, t0);
  report.tensors_direct = r.direct;
  report.tensors_staged = r.staged;
  report.stats = r.stats;
  report.stats.storages = c->storage_count();
  report.stats.tensors = report.tensors_copied;
  report.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

LoadIntoReport LoadRanges(const std::string& path, const std::vector<RangeTarget>& ranges, const LoadOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  auto c = Container::Open(path);
  loader::ResolveSlotBytes(options, c->superblock().chunk_bytes);
  (void)loader::VetObjectPickle(*c, options.allow_globals);  // as LoadInto
  LoadIntoReport report;

  // Every range checked before anything is written.
  std::vector<std::string> problems;
  std::vector<std::pair<const RangeTarget*, TensorInfo>> matched;
  for (const RangeTarget& r : ranges) {
    std::optional<uint32_t> i = c->FindTensor(r.name);
    if (!i) {
      problems.push_back("'" + r.name + "' is not in the file");
      continue;
    }
    TensorInfo info = c->tensor(*i);
    std::string why = TargetProblem(r.name, r.target);
    if (why.empty()) why = DTypeProblem(info, r.name, r.target);
    if (why.empty() && !loader::SavedContiguous(info))
      why = "'" + r.name + "' is not contiguous in its storage: element ranges need a contiguous saved tensor";
    if (why.empty() && !r.target.is_contiguous())
      why = "the target of '" + r.name + "' is not contiguous";
    const uint64_t numel = info.byte_end > info.byte_begin ? (info.byte_end - info.byte_begin) / DTypeSize(info.dtype) : 0;
    const auto count = static_cast<uint64_t>(r.target.numel());
    if (why.empty() && (r.begin > numel || count > numel - r.begin))
      why = "elements [" + std::to_string(r.begin) + ", " + std::to_string(r.begin + count) + ") of '" + r.name +
            "' are past its " + std::to_string(numel) + " elements";
    if (!why.empty()) {
      problems.push_back(why);
      continue;
    }
    matched.emplace_back(&r, std::move(info));
  }
  if (!problems.empty()) {
    std::string msg = "cannot load element ranges of " + path + ":";
    for (const auto& p : problems) msg += "\n  " + p;
    throw Error(ErrorKind::kInvalidArgument, msg);
  }

  const uint64_t chunk_bytes = c->superblock().chunk_bytes;
  std::vector<std::pair<uint64_t, loader::Piece>> pieces;
  std::vector<int> cuda_devices;
  std::vector<at::Tensor> written;
  for (const auto& [r, info] : matched) {
    ++report.tensors_copied;
    if (r->target.numel() == 0) continue;
    ++report.tensors_direct;
    NoteDevice(r->target, cuda_devices);
    const uint64_t item = DTypeSize(info.dtype);
    const uint64_t begin = info.byte_begin + r->begin * item;
    AddPieces(c->storage(info.storage), chunk_bytes, begin, begin + static_cast<uint64_t>(r->target.numel()) * item,
              static_cast<uint8_t*>(r->target.data_ptr()), r->target.is_cuda() ? r->target.get_device() : -1, -1,
              pieces);
    written.push_back(r->target);
  }
  loader::Destinations d(c->chunk_count(), std::move(pieces));
  report.stats = loader::StreamChunks(*c, d, options, cuda_devices);
  BumpVersions(written);
  report.stats.storages = c->storage_count();
  report.stats.tensors = report.tensors_copied;
  report.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace zckpt
