// fuzz_pickle: the restricted pickle interpreter and the torch.save interpretation on arbitrary
// bytes.
//
// pickle::Unpickle, then InterpretTorchPickle of the tree; and, for inputs that start with the
// legacy magic pickle, ParseLegacy of the whole input as a legacy torch file. Besides crashes and
// sanitizer reports it checks what the converter relies on: every tensor names a storage that
// exists, has as many strides as sizes, none negative, and reaches no byte past its storage
// (recomputed here with overflow checks); storage byte sizes are numel x element size; and a
// legacy layout's spans all lie inside the file.
#include <cstring>
#include <span>
#include <string>

#include "fuzz_target.h"
#include "pickle/legacy.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "zckpt/dtype.h"
#include "zckpt/error.h"

namespace zckpt::fuzz {

namespace {

// Limits smaller than the defaults, so one input cannot make the target slow for reasons the
// defaults already bound (the defaults are exercised by the unit tests).
// Globals are judged by the deny list only, so inputs reach the torch interpretation whatever
// names they spell (the allowlist is a few string compares, exercised by the unit tests).
pickle::UnpickleOptions FuzzOptions() {
  pickle::UnpickleOptions o;
  o.globals = pickle::GlobalPolicy::kDenyListOnly;
  o.max_nodes = size_t{1} << 20;
  o.max_total_bytes = uint64_t{1} << 26;
  return o;
}

// Last byte index + 1 the tensor touches, in bytes from its storage's start, or false when that
// does not fit in 64 bits (the interpreter must have refused such a tensor).
bool TensorEndBytes(const pickle::TorchTensor& t, uint64_t* out) {
  uint64_t element = DTypeSize(t.dtype);
  uint64_t end = static_cast<uint64_t>(t.storage_offset);
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] == 0) {
      *out = 0;
      return true;
    }
  }
  for (size_t i = 0; i < t.shape.size(); ++i) {
    uint64_t step;
    if (__builtin_mul_overflow(static_cast<uint64_t>(t.shape[i] - 1), static_cast<uint64_t>(t.stride[i]), &step))
      return false;
    if (__builtin_add_overflow(end, step, &end)) return false;
  }
  if (__builtin_add_overflow(end, uint64_t{1}, &end)) return false;
  return !__builtin_mul_overflow(end, element, out);
}

void CheckModel(const pickle::TorchPickle& m) {
  for (const pickle::TorchStorage& s : m.storages) {
    ZCKPT_FUZZ_CHECK(DTypeSize(s.dtype) > 0);
    uint64_t nbytes;
    ZCKPT_FUZZ_CHECK(!__builtin_mul_overflow(s.numel, uint64_t{DTypeSize(s.dtype)}, &nbytes));
    ZCKPT_FUZZ_CHECK(nbytes == s.nbytes);
  }
  for (const pickle::TorchTensor& t : m.tensors) {
    ZCKPT_FUZZ_CHECK(t.storage < m.storages.size());
    ZCKPT_FUZZ_CHECK(DTypeSize(t.dtype) > 0);
    ZCKPT_FUZZ_CHECK(t.shape.size() == t.stride.size());
    ZCKPT_FUZZ_CHECK(t.storage_offset >= 0);
    for (size_t i = 0; i < t.shape.size(); ++i) ZCKPT_FUZZ_CHECK(t.shape[i] >= 0 && t.stride[i] >= 0);
    uint64_t end = 0;
    ZCKPT_FUZZ_CHECK(TensorEndBytes(t, &end));
    ZCKPT_FUZZ_CHECK(end <= m.storages[t.storage].nbytes);
  }
}

void CheckLegacy(const pickle::LegacyLayout& l, size_t size) {
  ZCKPT_FUZZ_CHECK(l.object_pickle_offset <= size && l.object_pickle_size <= size - l.object_pickle_offset);
  ZCKPT_FUZZ_CHECK(l.keys_pickle_offset <= size && l.keys_pickle_size <= size - l.keys_pickle_offset);
  ZCKPT_FUZZ_CHECK(l.object_pickle_offset + l.object_pickle_size <= l.header_end);
  ZCKPT_FUZZ_CHECK(l.header_end <= l.data_end && l.data_end <= size);
  ZCKPT_FUZZ_CHECK(l.model.storages.size() == l.storages.size());
  uint64_t at = l.header_end;
  for (size_t i = 0; i < l.storages.size(); ++i) {
    const pickle::LegacyStorage& s = l.storages[i];
    ZCKPT_FUZZ_CHECK(s.key == l.model.storages[i].key);
    ZCKPT_FUZZ_CHECK(s.count_offset == at && s.data_offset == s.count_offset + 8);
    ZCKPT_FUZZ_CHECK(s.data_offset <= size && s.nbytes <= size - s.data_offset);
    uint64_t nbytes;
    ZCKPT_FUZZ_CHECK(!__builtin_mul_overflow(s.numel, uint64_t{DTypeSize(s.dtype)}, &nbytes) && nbytes == s.nbytes);
    at = s.data_offset + s.nbytes;
  }
  ZCKPT_FUZZ_CHECK(at == l.data_end);
  CheckModel(l.model);
}

}  // namespace

void FuzzPickle(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  const pickle::UnpickleOptions options = FuzzOptions();
  try {
    pickle::UnpickleResult r = pickle::Unpickle(bytes, options);
    ZCKPT_FUZZ_CHECK(r.root != nullptr && r.arena != nullptr);
    ZCKPT_FUZZ_CHECK(r.end_offset >= 1 && r.end_offset <= size);
    try {
      CheckModel(pickle::InterpretTorchPickle(r));
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  if (pickle::IsLegacyTorchFile(bytes)) {
    try {
      CheckLegacy(pickle::ParseLegacy(bytes, options), size);
    } catch (const Error&) {
    }
  }
}

}  // namespace zckpt::fuzz

ZCKPT_FUZZ_ENTRY(zckpt::fuzz::FuzzPickle)
