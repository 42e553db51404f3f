#include "pickle/torch_storages.h"

#include "pickle/torch_values.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

namespace {

[[noreturn]] void Corrupt(uint64_t offset, const std::string& what) {
  throw Error(ErrorKind::kCorrupt, "storage persistent id at pickle byte offset " + std::to_string(offset) + ": " + what);
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// The storage class of a persistent id: torch accepts any global whose name ends in
// "Storage", whatever its module (torch.FloatStorage, torch.cuda.FloatStorage, ...).
void ReadStorageType(const Value* type, uint64_t offset, TorchStorage& s) {
  if (!type || type->kind != Kind::kGlobal) Corrupt(offset, "storage type is not a global");
  if (type->text.size() + type->name.size() > kMaxShortText) Corrupt(offset, "storage type name too long");
  s.storage_type = GlobalPath(type);
  if (type->name == "UntypedStorage") {
    s.untyped = true;
    s.dtype = DType::kUInt8;
    return;
  }
  auto dtype = DTypeFromStorageName(type->name);
  if (!dtype) throw Error(ErrorKind::kUnsupported, "unknown storage type '" + s.storage_type + "'");
  s.dtype = *dtype;
}

std::string KeyText(const Value* v, uint64_t offset) {
  if (auto s = AsShortText(v)) return *s;
  if (auto i = AsInt(v)) return std::to_string(*i);
  Corrupt(offset, "storage key is not a string of at most " + std::to_string(kMaxShortText) + " bytes");
}

}  // namespace

StorageTable::StorageTable(const ValueArena& arena) {
  for (const Value& v : arena.nodes())
    if (v.kind == Kind::kPersistentId) refs_.emplace(&v, Add(&v));
}

const StorageRef& StorageTable::Resolve(const Value* pid) const {
  auto it = pid ? refs_.find(pid) : refs_.end();
  if (it == refs_.end())
    throw Error(ErrorKind::kCorrupt, "tensor storage argument is a " +
                                         std::string(pid ? KindName(pid->kind) : "missing value") +
                                         ", not a storage persistent id");
  return it->second;
}

size_t StorageTable::AddRoot(TorchStorage s, uint64_t offset) {
  auto [it, inserted] = by_key_.emplace(s.key, storages_.size());
  if (inserted) {
    storages_.push_back(std::move(s));
    return it->second;
  }
  const TorchStorage& old = storages_[it->second];
  if (old.storage_type != s.storage_type || old.location != s.location || old.numel != s.numel)
    Corrupt(offset, "storage key '" + s.key + "' claimed as " + old.storage_type + "[" + std::to_string(old.numel) +
                        "] on " + old.location + " and as " + s.storage_type + "[" + std::to_string(s.numel) +
                        "] on " + s.location);
  return it->second;
}

StorageRef StorageTable::Add(const Value* pid) {
  const uint64_t at = pid->offset;
  const std::vector<Value*>* f = Sequence(pid->pid);
  if (!f || pid->pid->kind != Kind::kTuple || (f->size() != 5 && f->size() != 6))
    Corrupt(at, "expected a tuple ('storage', type, key, location, numel[, view])");
  if (AsShortText((*f)[0]) != std::optional<std::string>("storage"))
    Corrupt(at, "persistent id is not a storage");
  TorchStorage s;
  ReadStorageType((*f)[1], at, s);
  s.key = KeyText((*f)[2], at);
  auto location = AsShortText((*f)[3]);
  if (!location) Corrupt(at, "storage location is not a short string");
  s.location = *location;
  auto numel = AsInt((*f)[4]);
  if (!numel || *numel < 0) Corrupt(at, "storage size is not a non-negative int");
  s.numel = static_cast<uint64_t>(*numel);
  const uint64_t element = DTypeSize(s.dtype);
  if (MulOverflows(s.numel, element, &s.nbytes)) Corrupt(at, "storage byte size overflows");

  StorageRef ref;
  ref.view_nbytes = s.nbytes;
  ref.index = AddRoot(std::move(s), at);
  const Value* view = f->size() == 6 ? (*f)[5] : nullptr;
  if (!view || view->kind == Kind::kNone) return ref;

  // Legacy storage view: (view_key, offset, size) in elements of the root's type.
  const std::vector<Value*>* vf = Sequence(view);
  if (!vf || vf->size() != 3) Corrupt(at, "storage view is not (key, offset, size)");
  std::string view_key = KeyText((*vf)[0], at);
  auto offset = AsInt((*vf)[1]);
  auto size = AsInt((*vf)[2]);
  if (!offset || !size || *offset < 0 || *size < 0) Corrupt(at, "storage view offset/size are not non-negative ints");
  const TorchStorage& root = storages_[ref.index];
  uint64_t end = 0;
  if (__builtin_add_overflow(static_cast<uint64_t>(*offset), static_cast<uint64_t>(*size), &end) || end > root.numel)
    Corrupt(at, "storage view '" + view_key + "' [" + std::to_string(*offset) + ", +" + std::to_string(*size) +
                    ") exceeds storage '" + root.key + "' of " + std::to_string(root.numel) + " elements");
  ref.view_offset_bytes = static_cast<uint64_t>(*offset) * element;
  ref.view_nbytes = static_cast<uint64_t>(*size) * element;
  auto [it, inserted] = views_.emplace(view_key, ref);
  const StorageRef& old = it->second;
  if (!inserted && (old.index != ref.index || old.view_offset_bytes != ref.view_offset_bytes ||
                    old.view_nbytes != ref.view_nbytes))
    Corrupt(at, "storage view key '" + view_key + "' claimed twice with different extents");
  return ref;
}

}  // namespace zckpt::pickle
