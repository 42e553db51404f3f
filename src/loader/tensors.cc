#include "loader/tensors.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <torch/version.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string_view>

#include "loader/object_tree.h"
#include "loader/plan.h"
#include "zckpt/format.h"

namespace zckpt::loader {

namespace {

// c10's enum names of each zckpt dtype code (index = code). By name rather than by enumerator
// so one source builds against any torch 2.x: dtypes a release lacks are simply not found.
constexpr std::array<std::string_view, kMaxDTypeCode + 1> kC10Names = {
    "",             "Bool",          "Byte",          "Char",           "Short",        "Int",
    "Long",         "UInt16",        "UInt32",        "UInt64",         "Half",         "BFloat16",
    "Float",        "Double",        "ComplexHalf",   "ComplexFloat",   "ComplexDouble", "Float8_e4m3fn",
    "Float8_e5m2",  "Float8_e4m3fnuz", "Float8_e5m2fnuz", "Float8_e8m0fnu", "Float4_e2m1fn_x2", "QInt8",
    "QUInt8",       "QInt32",        "QUInt4x2",      "QUInt2x4",       "Bits1x8",      "Bits2x4",
    "Bits4x2",      "Bits8",         "Bits16",        "UInt1",          "UInt2",        "UInt3",
    "UInt4",        "UInt5",         "UInt6",         "UInt7",          "Int1",         "Int2",
    "Int3",         "Int4",          "Int5",          "Int6",           "Int7",         "BComplex32",
};

const std::map<std::string_view, c10::ScalarType>& C10Types() {
#define ZCKPT_SCALAR_TYPE(_, name) {#name, c10::ScalarType::name},
  static const std::map<std::string_view, c10::ScalarType> types = {
      AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(ZCKPT_SCALAR_TYPE)};
#undef ZCKPT_SCALAR_TYPE
  return types;
}

at::Tensor ViewOver(const c10::Storage& storage, c10::ScalarType st, c10::IntArrayRef sizes,
                    c10::IntArrayRef strides, int64_t offset) {
  // Built directly on the TensorImpl (as at::empty does) rather than through set_/as_strided, so
  // no operator has to exist for exotic dtypes (bits8, uint4, float4).
  c10::DispatchKeySet keys(c10::computeDispatchKey(st, c10::kStrided, storage.device()));
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), keys, c10::scalarTypeToTypeMeta(st));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

}  // namespace

c10::ScalarType ToScalarType(DType d, const std::string& what) {
  auto code = static_cast<uint16_t>(d);
  if (IsValidDType(code)) {
    auto it = C10Types().find(kC10Names[code]);
    if (it != C10Types().end() && c10::elementSize(it->second) == DTypeSize(d)) return it->second;
  }
  throw Error(ErrorKind::kUnsupported, what + ": dtype " + std::string(DTypeName(d)) +
                                           " is not available in the torch zckpt was built against (" +
                                           std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ")");
}

void CheckViewable(const Container& c, const TensorInfo& t) {
  std::string what = "tensor '" + std::string(t.name) + "' in " + c.path();
  c10::ScalarType st = ToScalarType(t.dtype, what);
  if (c10::isQIntType(st) || (t.flags & format::kTensorQuantized))
    throw Error(ErrorKind::kUnsupported, what + " is quantized: its quantizer lives in the object pickle; load the "
                                                "storages (LoadStorages / the Python module) and let torch rebuild it");
}

namespace {

void FreeAligned(void* p) { std::free(p); }

}  // namespace

at::Tensor AllocateBytes(uint64_t bytes, c10::Device device) {
  // Plain pages: madvise(MADV_HUGEPAGE) on CPU destinations was tried and made loads 2-3x
  // slower here (direct compaction on fault under THP defrag=madvise).
  // A host allocation that fails is kOutOfMemory, however it failed: the CPU allocator reports it
  // as a plain c10::Error (the CUDA one throws c10::OutOfMemoryError, which WithTorchErrors maps);
  // an allocation of a valid size fails for want of memory only.
  auto out_of_memory = [&](const std::string& why) {
    return Error(ErrorKind::kOutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes of host memory: " + why);
  };
  if (device.is_cpu() && bytes >= kBlockAlignedFrom) {
    // Block-aligned (kDirectIoAlign), so that a storage's bytes (as aligned in the file) can be
    // read straight into it with O_DIRECT when they are not in the page cache (ChunkReader). torch's CPU
    // allocator aligns to 64 bytes only. Resizing still works: the storage keeps torch's
    // allocator for any new memory.
    void* p = nullptr;
    if (int rc = posix_memalign(&p, kDirectIoAlign, static_cast<size_t>(bytes)); rc != 0) throw out_of_memory(std::strerror(rc));
    return WithTorchErrors([&] {
      c10::DataPtr ptr(p, p, &FreeAligned, device);
      c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(bytes), std::move(ptr),
                           c10::GetCPUAllocator(), true);
      return BytesOf(storage);
    });
  }
  auto empty = [&] {
    return at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
  };
  if (!device.is_cpu()) return WithTorchErrors(empty);
  try {
    return empty();
  } catch (const c10::Error& e) {
    throw out_of_memory(e.what_without_backtrace());
  }
}

at::Tensor BytesOf(const c10::Storage& storage) {
  auto n = static_cast<int64_t>(storage.nbytes());
  return ViewOver(storage, at::kByte, {n}, {1}, 0);
}

at::Tensor MakeView(const c10::Storage& storage, const TensorInfo& t, int64_t storage_offset) {
  c10::ScalarType st = ToScalarType(t.dtype, "tensor '" + std::string(t.name) + "'");
  at::Tensor v = ViewOver(storage, st, t.shape, t.stride, storage_offset);
  // As torch.set_tensor_metadata / _rebuild_tensor_v2: the stored bytes are the un-conjugated,
  // un-negated data; the bits make the view read as the original did.
  if ((t.flags & format::kTensorConj) && c10::isComplexType(st)) v._set_conj(true);
  if (t.flags & format::kTensorNeg) v._set_neg(true);
  if ((t.flags & format::kTensorRequiresGrad) && (c10::isFloatingType(st) || c10::isComplexType(st)))
    v.set_requires_grad(true);
  return v;
}

std::optional<checkpoint::ObjectPickle> VetObjectPickle(const Container& c, const std::vector<std::string>& allow_globals) {
  checkpoint::PickleReadOptions read;
  read.allow_globals = allow_globals;
  return checkpoint::ReadObjectPickle(c, read);
}

void BuildTensorSet(const Container& c, const std::vector<at::Tensor>& bytes, bool views, TensorSet* out,
                    const std::optional<checkpoint::ObjectPickle>* tree) {
  for (uint32_t s = 0; s < c.storage_count(); ++s) out->storages_by_key.emplace(std::string(c.storage(s).key), bytes[s]);
  if (!views) return;
  out->tensors.reserve(c.tensor_count());
  out->meta.reserve(c.tensor_count());
  for (uint32_t i = 0; i < c.tensor_count(); ++i) {
    TensorInfo t = c.tensor(i);
    const c10::Storage& storage = bytes[t.storage].storage();
    out->add(std::string(t.name), MakeView(storage, t, static_cast<int64_t>(t.storage_offset)),
             TensorMeta{std::string(c.storage(t.storage).key), t.flags, std::string(t.extra)});
  }
  if (tree) out->tree = BuildObjectTree(c, *out, *tree);
}

}  // namespace zckpt::loader

namespace zckpt {

at::Tensor TensorSet::get(const std::string& name) const {
  std::optional<size_t> at = find(name);
  if (!at) throw Error(ErrorKind::kInvalidArgument, "no tensor named '" + name + "'");
  return tensors[*at].second;
}

std::optional<size_t> TensorSet::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void TensorSet::add(std::string name, at::Tensor tensor, TensorMeta meta) {
  index_.emplace(name, tensors.size());
  tensors.emplace_back(std::move(name), std::move(tensor));
  this->meta.push_back(std::move(meta));
}

}  // namespace zckpt
