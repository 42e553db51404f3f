// TensorStream: a container's tensors one at a time (include/zckpt/tensor_stream.h).
#include "zckpt/tensor_stream.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <string>
#include <utility>

#include "common/byte_source.h"
#include "common/mapped_file.h"
#include "common/shape.h"
#include "format/container_file.h"
#include "loader/copy_views.h"
#include "loader/stream.h"
#include "loader/tensors.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt {

namespace {

// CPU tensors of 1 MiB and more get pages of their own (mmap), returned to the system when the
// last reference goes: through malloc, glibc's dynamic mmap threshold moves such sizes onto the
// heap after the first free, and a stream of tensors each freed after use then grew the heap (64
// MiB resident after sixteen 8 MiB tensors, measured) instead of reusing one tensor's memory.
constexpr uint64_t kOwnPagesFrom = 1ull << 20;

struct Mapping {
  void* p;
  size_t bytes;
};

void Unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  munmap(m->p, m->bytes);
  delete m;
}

c10::Storage OwnPages(uint64_t bytes, std::string_view name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error(ErrorKind::kOutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes of host memory for '" +
                                             std::string(name) + "': " + std::strerror(errno));
  auto* ctx = new Mapping{p, static_cast<size_t>(bytes)};
  return loader::WithTorchErrors([&] {
    c10::DataPtr ptr(p, ctx, &Unmap, c10::Device(c10::kCPU));
    return c10::Storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(bytes), std::move(ptr),
                        c10::GetCPUAllocator(), false);
  });
}

}  // namespace

// A fresh tensor for record `info`. Large CPU ones reuse the pages of one of the last two handed
// out once nothing references it any more (the consumer dropped it and every view of it): a
// consumer looping `for name, t in stream` holds the previous tensor while asking for the next,
// so two alternate, and their pages are faulted in once instead of once per tensor.
at::Tensor TensorStream::Destination(const TensorInfo& info, c10::ScalarType st) {
  uint64_t bytes = DTypeSize(info.dtype);
  for (int64_t d : info.shape) bytes *= static_cast<uint64_t>(d);
  if (!device_.is_cpu() || bytes < kOwnPagesFrom) {
    auto options = at::TensorOptions().dtype(st).device(device_);
    return loader::WithTorchErrors([&] { return at::empty(c10::IntArrayRef(info.shape), options); });
  }
  c10::Storage storage;
  for (auto it = recent_.begin(); it != recent_.end(); ++it) {
    if (it->use_count() == 1 && it->nbytes() >= bytes) {
      storage = std::move(*it);
      recent_.erase(it);
      break;
    }
  }
  if (!storage) {
    std::erase_if(recent_, [](const c10::Storage& s) { return s.use_count() == 1; });  // too small: freed
    storage = OwnPages(bytes, info.name);
  }
  recent_.push_back(storage);
  if (recent_.size() > 2) recent_.erase(recent_.begin());  // the consumer keeps that one
  TensorInfo dense = info;  // the tensor as a plain contiguous one at the start of the storage
  dense.stride = ContiguousStrides(info.shape);
  dense.storage_offset = 0;
  dense.flags = 0;
  return loader::WithTorchErrors([&] { return loader::MakeView(storage, dense, 0); });
}

TensorStream::TensorStream(std::shared_ptr<const Container> container, c10::Device device, TensorStreamOptions options)
    : c_(std::move(container)), device_(device), options_(std::move(options)) {
  loader::ResolveContainerLoad(options_.load, *c_);
  (void)loader::VetObjectPickle(*c_, options_.load.allow_globals);
  for (uint32_t i = 0; i < c_->tensor_count(); ++i) loader::CheckViewable(*c_, c_->tensor(i));
  if (options_.verify_first) {
    VerifyOptions vo;
    vo.threads = options_.verify_threads;
    vo.cancel = options_.load.cancel;
    VerifyReport report = c_->Verify(vo);
    if (!report.ok()) {
      std::string msg = c_->path() + ": verified before the first tensor was handed out: " +
                        std::to_string(report.problems.size()) + " problem(s):";
      for (const auto& p : report.problems) msg += "\n  " + p.message;
      throw Error(ErrorKind::kCorrupt, msg);
    }
  }
}

TensorStream::~TensorStream() = default;

uint32_t TensorStream::remaining() const {
  uint32_t n = 0;
  for (uint32_t i = next_; i < c_->tensor_count(); ++i)
    if (!(c_->tensor(i).flags & format::kTensorInternal)) ++n;
  return n;
}

// From an object, the storages of the tensors after the one being read are fetched ahead (the
// source holds them, within its budget, until read): one tensor at a time would keep one GET in
// flight.
void TensorStream::ReadAhead() {
  const ByteSource* source = format::internal::ContainerFile::Of(*c_).remote();
  if (!source) return;
  for (ahead_ = std::max(ahead_, next_); ahead_ < c_->tensor_count(); ++ahead_) {
    const TensorInfo t = c_->tensor(ahead_);
    if (t.flags & format::kTensorInternal || t.storage == ahead_storage_) continue;
    const StorageInfo s = c_->storage(t.storage);
    if (s.chunk_count == 0) continue;
    const format::ChunkRecord last = c_->chunk(s.first_chunk + s.chunk_count - 1);
    const uint64_t begin = c_->chunk(s.first_chunk).offset, end = last.offset + last.stored_bytes;
    if (!source->Prefetch(begin, end - begin)) return;  // the budget is full: later
    ahead_storage_ = t.storage;
  }
}

bool TensorStream::Next(std::string* name, at::Tensor* tensor) {
  while (next_ < c_->tensor_count() && (c_->tensor(next_).flags & format::kTensorInternal)) ++next_;
  if (next_ >= c_->tensor_count()) return false;
  auto t0 = std::chrono::steady_clock::now();
  TensorInfo info = c_->tensor(next_++);
  ReadAhead();
  std::string n(info.name);
  at::Tensor target = Destination(info, loader::ToScalarType(info.dtype, n));
  std::vector<loader::ViewCopy> copies;
  copies.push_back(loader::ViewCopy{target, info});
  loader::ViewCopyReport r = loader::CopyViews(*c_, std::move(copies), options_.load, t0);
  stats_.raw_bytes += r.stats.raw_bytes;
  stats_.stored_bytes += r.stats.stored_bytes;
  stats_.chunks += r.stats.chunks;
  stats_.destination_chunks += r.stats.destination_chunks;
  stats_.batches += r.stats.batches;
  stats_.ring_bytes = std::max(stats_.ring_bytes, r.stats.ring_bytes);
  stats_.tensors += 1;
  stats_.verified = r.stats.verified;
  stats_.seconds += r.stats.seconds;
  *name = std::move(n);
  *tensor = std::move(target);
  return true;
}

}  // namespace zckpt
