#include "loader/object_tree.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/core/Device.h>

#include <unordered_map>
#include <unordered_set>

#include "pickle/bigint.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "pickle/value.h"
#include "zckpt/format.h"

namespace zckpt::loader {

namespace {

using pickle::Kind;
using pickle::Value;

// "module.name" of a global, with the Python 2 module names protocol 0-2 pickles use mapped as
// Python's unpickler maps them (fix_imports): `__builtin__.complex` is `builtins.complex`.
std::string ClassName(const Value* global) {
  std::string path = pickle::GlobalPath(global);
  for (auto [py2, py3] : {std::pair<std::string_view, std::string_view>{"__builtin__.", "builtins."}, {"copy_reg.", "copyreg."}})
    if (path.starts_with(py2)) return std::string(py3) + path.substr(py2.size());
  return path;
}

class TreeBuilder {
 public:
  TreeBuilder(const Container& c, const TensorSet& set, const pickle::TorchPickle& model, size_t max_depth)
      : c_(c), set_(set), max_depth_(max_depth) {
    // The first record made at a node is the tensor the node evaluates to (later ones at the same
    // node are a second path to it, or its quantizer's `.scales`/`.zero_points`).
    for (const pickle::TorchTensor& t : model.tensors) {
      if (t.internal || tensor_at_.count(t.pickle_offset)) continue;
      std::optional<size_t> at = set.find(t.name);
      if (!at)
        throw Error(ErrorKind::kCorrupt, c.path() + ": the object pickle names tensor '" + t.name +
                                             "', which the container's tensor table lacks");
      tensor_at_.emplace(t.pickle_offset, *at);
    }
  }

  // Recursive, so bounded here, where the recursion happens: the unpickler refused trees higher
  // than max_depth, and a walk of this one never goes deeper than that (checked, not assumed).
  c10::IValue Convert(const Value* v) {
    if (v == nullptr) return c10::IValue();
    if (auto done = done_.find(v); done != done_.end()) return done->second;  // memo: same object
    if (open_.size() >= max_depth_)
      throw Error(ErrorKind::kCorrupt, c_.path() + ": object pickle: object tree deeper than " +
                                           std::to_string(max_depth_) + " at pickle byte offset " + std::to_string(v->offset));
    if (!open_.insert(v).second) return c10::IValue();  // a cycle: documented as None
    c10::IValue out = ConvertNew(v);
    open_.erase(v);
    done_.emplace(v, out);
    return out;
  }

 private:
  c10::IValue ConvertNew(const Value* v) {
    switch (v->kind) {
      case Kind::kNone: return c10::IValue();
      case Kind::kBool: return c10::IValue(v->boolean);
      case Kind::kInt: return c10::IValue(v->integer);
      case Kind::kBigInt: return c10::IValue(pickle::BigIntToDecimal(v->text));
      case Kind::kFloat: return c10::IValue(v->real);
      case Kind::kString:
      case Kind::kBytes: return c10::IValue(v->text);
      case Kind::kGlobal: return c10::IValue(ClassName(v));
      case Kind::kTuple: return c10::ivalue::Tuple::create(Items(v->items));
      case Kind::kList:
      case Kind::kSet:
      case Kind::kFrozenSet: return ListOf(v->items);
      case Kind::kDict: return DictOf(nullptr, v->entries);
      case Kind::kPersistentId: return Storage(v);
      case Kind::kObject: return Object(v);
    }
    return c10::IValue();
  }

  std::vector<c10::IValue> Items(const std::vector<Value*>& items) {
    std::vector<c10::IValue> out;
    out.reserve(items.size());
    for (const Value* item : items) out.push_back(Convert(item));
    return out;
  }

  c10::IValue ListOf(const std::vector<Value*>& items) {
    c10::impl::GenericList list(c10::AnyType::get());
    list.reserve(items.size());
    for (const Value* item : items) list.push_back(Convert(item));
    return list;
  }

  // Keys IValue can hash (str, int, float, bool, tensors, devices) stay as they are; any
  // other key (a tuple, an object) becomes its Python-like rendering.
  void Insert(c10::impl::GenericDict& dict, const Value* key, c10::IValue value) {
    c10::IValue k = Convert(key);
    if (!(k.isString() || k.isInt() || k.isDouble() || k.isBool() || k.isTensor() || k.isDevice()))
      k = c10::IValue(pickle::Render(key, 8, 4096));
    dict.insert_or_assign(std::move(k), std::move(value));  // a repeated key: the last wins, as in Python
  }

  // A dict, or an OrderedDict object: `pairs` (its args' list of pairs) then `entries` (SETITEMs).
  c10::IValue DictOf(const Value* pairs, const std::vector<std::pair<Value*, Value*>>& entries) {
    c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
    if (const auto* seq = pickle::Sequence(pairs))
      for (const Value* pair : *seq)
        if (const auto* kv = pickle::Sequence(pair); kv && kv->size() == 2) Insert(dict, (*kv)[0], Convert((*kv)[1]));
    for (const auto& [k, val] : entries) Insert(dict, k, Convert(val));
    return dict;
  }

  c10::IValue Storage(const Value* v) {
    const auto* f = pickle::Sequence(v->pid);
    if (!f || f->size() < 3 || (*f)[2]->kind != Kind::kString) return c10::IValue();
    auto it = set_.storages_by_key.find((*f)[2]->text);
    return it == set_.storages_by_key.end() ? c10::IValue() : c10::IValue(it->second);
  }

  c10::IValue Object(const Value* v) {
    if (auto it = tensor_at_.find(v->offset); it != tensor_at_.end()) return set_.tensors[it->second].second;
    const std::string cls = ClassName(v->callable);
    const auto* args = pickle::Sequence(v->args);
    if (cls == "collections.OrderedDict")
      return DictOf(args && !args->empty() ? (*args)[0] : nullptr, v->entries);
    if (cls == "torch.Size" && args && args->size() == 1 && pickle::Sequence((*args)[0]))
      return c10::ivalue::Tuple::create(Items(*pickle::Sequence((*args)[0])));
    if (cls == "torch.device" && args && !args->empty()) {
      try {
        std::string spec = (*args)[0]->kind == Kind::kString ? (*args)[0]->text : "";
        if (args->size() > 1 && (*args)[1]->kind == Kind::kInt) spec += ":" + std::to_string((*args)[1]->integer);
        return c10::IValue(c10::Device(spec));
      } catch (const c10::Error&) {
        // not a device this torch knows: fall through to the generic form
      }
    }
    // Anything else is described, never built: {"__class__", "__args__", "__kwargs__",
    // "__items__", "__entries__", "__state__"}, the parts the pickle has.
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    dict.insert("__class__", cls.empty() ? pickle::Render(v->callable, 8, 4096) : cls);
    if (v->args) dict.insert("__args__", Convert(v->args));
    if (v->kwargs) dict.insert("__kwargs__", Convert(v->kwargs));
    if (!v->items.empty()) dict.insert("__items__", ListOf(v->items));
    if (!v->entries.empty()) dict.insert("__entries__", DictOf(nullptr, v->entries));
    if (v->state) dict.insert("__state__", Convert(v->state));
    return dict;
  }

  const Container& c_;
  const TensorSet& set_;
  const size_t max_depth_;
  std::unordered_map<uint64_t, size_t> tensor_at_;  // node offset -> index in set_.tensors
  std::unordered_map<const Value*, c10::IValue> done_;
  std::unordered_set<const Value*> open_;
};

}  // namespace

c10::IValue BuildObjectTree(const Container& c, const TensorSet& set, const std::optional<checkpoint::ObjectPickle>& pickle) {
  if (!pickle) {
    c10::impl::GenericDict flat(c10::StringType::get(), c10::TensorType::get());
    for (const auto& [name, t] : set.tensors) flat.insert(name, t);
    return flat;
  }
  return TreeBuilder(c, set, pickle->model, pickle->tree.max_depth).Convert(pickle->tree.root);
}

}  // namespace zckpt::loader
