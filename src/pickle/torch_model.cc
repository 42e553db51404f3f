#include "pickle/torch_model.h"

#include <unordered_map>
#include <unordered_set>

#include "pickle/bigint.h"
#include "pickle/text_codec.h"
#include "pickle/torch_storages.h"
#include "pickle/torch_tensors.h"
#include "pickle/torch_values.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

namespace {

std::string Join(const std::string& path, const std::string& segment) {
  if (segment.empty()) return path;
  return path.empty() ? segment : path + "." + segment;
}

// A dict key as a path segment: strings and ints as they read, anything else rendered.
std::string KeySegment(const Value* key) {
  switch (key->kind) {
    case Kind::kString: return key->text;
    case Kind::kInt: return std::to_string(key->integer);
    case Kind::kBigInt: return BigIntToDecimal(key->text);
    case Kind::kBytes: return Latin1ToUtf8(key->text);
    default: return Render(key, 4, 64);
  }
}

bool IsNumpyCall(const Value* obj, std::string_view name) {
  const Value* g = ObjectGlobal(obj);
  return g && g->name == name && (g->text == "numpy" || g->text.rfind("numpy.", 0) == 0);
}

// numpy's dtype.str for a `numpy.dtype(kind, align, copy)` object with its BUILD state
// (version, byteorder, ...): "<u4", "|b1".
std::string NumpyDtype(const Value* dtype) {
  const std::vector<Value*>* args = dtype ? Sequence(dtype->args) : nullptr;
  auto code = args && !args->empty() ? AsText((*args)[0]) : std::nullopt;
  if (!code) return "?";
  const std::vector<Value*>* state = Sequence(dtype->state);
  auto order = state && state->size() > 1 ? AsText((*state)[1]) : std::nullopt;
  return (order ? *order : std::string()) + *code;
}

// Globals that are torch's own or plain Python data; everything else is listed as opaque.
bool IsOpaque(const Value* g) {
  if (!g || g->kind != Kind::kGlobal) return false;
  const std::string& m = g->text;
  return !(IsTorchGlobal(g) || m == "collections" || m == "builtins" || m == "__builtin__" || m == "_codecs" ||
           m == "copyreg" || m == "copy_reg" || m == "numpy" || m.rfind("numpy.", 0) == 0);
}

class Walker {
 public:
  explicit Walker(const UnpickleResult& pickle)
      : pickle_(pickle), storages_(*pickle.arena), tensors_(storages_) {}

  TorchPickle Run() {
    Push(pickle_.root, "", 0);
    Flush(0);
    while (!stack_.empty()) {
      Frame f = std::move(stack_.back());
      stack_.pop_back();
      Visit(f);
    }
    out_.storages = storages_.TakeStorages();
    return std::move(out_);
  }

 private:
  struct Frame {
    const Value* node;
    std::string path;
    size_t depth;
    bool is_state;  // an object's BUILD state: attributes sit directly under `path`
  };

  // Children are collected in order, then pushed reversed so the walk is depth-first in
  // pickle order.
  void Push(const Value* node, std::string path, size_t depth, bool is_state = false) {
    if (node) pending_.push_back({node, std::move(path), depth, is_state});
  }
  void Flush(size_t first) {
    for (size_t i = pending_.size(); i-- > first;) stack_.push_back(std::move(pending_[i]));
    pending_.resize(first);
  }

  void Visit(const Frame& f) {
    if (f.depth > pickle_.max_depth)
      throw Error(ErrorKind::kCorrupt, "object tree deeper than " + std::to_string(pickle_.max_depth) + " at '" +
                                           f.path + "'");
    const size_t first = pending_.size();
    if (f.is_state) PushState(f.node, f.path, f.depth);
    else if (visited_.insert(f.node).second) VisitNode(f.node, f.path, f.depth);
    Flush(first);
  }

  void VisitNode(const Value* v, const std::string& path, size_t depth) {
    switch (v->kind) {
      case Kind::kDict:
        for (const auto& [k, val] : v->entries) Push(val, Join(path, KeySegment(k)), depth + 1);
        return;
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
      case Kind::kFrozenSet:
        for (size_t i = 0; i < v->items.size(); ++i) Push(v->items[i], Join(path, std::to_string(i)), depth + 1);
        return;
      case Kind::kGlobal: return CountOpaque(v);
      case Kind::kObject: return VisitObject(v, path, depth);
      default: return;
    }
  }

  void VisitObject(const Value* v, const std::string& path, size_t depth) {
    if (auto found = tensors_.Interpret(v, path.empty() ? "tensor" : path)) return Record(*found, v, path, depth);
    if (IsNumpyCall(v, "_reconstruct")) return RecordArray(v, path);
    if (IsNumpyCall(v, "scalar")) return RecordScalar(v, path);
    const Value* g = ObjectGlobal(v);
    bool copyreg = g && (g->text == "copyreg" || g->text == "copy_reg");
    // copyreg._reconstructor(cls, base, state) and __newobj__(cls, ...) build a `cls`.
    const std::vector<Value*>* args = Sequence(v->args);
    CountOpaque(copyreg && args && !args->empty() ? (*args)[0] : g);
    if (!g) Push(v->callable, path, depth + 1);
    if (copyreg) {
      // (cls, base, state) or (cls, *args): the class was counted; nothing else to search.
    } else if (args) {
      for (size_t i = 0; i < args->size(); ++i) Push((*args)[i], Join(path, std::to_string(i)), depth + 1);
    } else if (v->args) {
      Push(v->args, path, depth + 1);
    }
    if (v->kwargs) PushState(v->kwargs, path, depth);
    for (size_t i = 0; i < v->items.size(); ++i) Push(v->items[i], Join(path, std::to_string(i)), depth + 1);
    for (const auto& [k, val] : v->entries) Push(val, Join(path, KeySegment(k)), depth + 1);
    if (v->state) Push(v->state, path, depth + 1, true);
  }

  // An object state: a dict or (dict, slots) tuple puts its attributes at `path.attr`.
  void PushState(const Value* state, const std::string& path, size_t depth) {
    auto attributes = StateAttributes(state);
    if (attributes.empty()) return Push(state, path, depth + 1);
    if (!visited_.insert(state).second) return;
    for (const auto& [name, val] : attributes) Push(val, Join(path, name), depth + 1);
  }

  void Record(TensorFinding& found, const Value* node, const std::string& path, size_t depth) {
    for (const Value* c : found.consumed) visited_.insert(c);
    for (auto& named : found.tensors) {
      std::string name = Join(path, named.suffix);
      named.tensor.name = UniqueName(name.empty() ? "tensor" : name);
      named.tensor.pickle_offset = node->offset;
      out_.tensors.push_back(std::move(named.tensor));
    }
    for (const auto& more : found.walk) Push(more.node, Join(path, more.suffix), depth + 1, more.is_state);
  }

  std::string UniqueName(const std::string& base) {
    if (names_.insert(base).second) return base;
    for (size_t n = 1;; ++n) {
      std::string candidate = base + "~" + std::to_string(n);
      if (names_.insert(candidate).second) return candidate;
    }
  }

  // ndarray: _reconstruct(ndarray, (0,), b'b') + BUILD (version, shape, dtype, fortran, data).
  void RecordArray(const Value* v, const std::string& path) {
    NumpyValue n;
    n.path = path;
    const std::vector<Value*>* s = Sequence(v->state);
    size_t base = s && s->size() == 5 ? 1 : 0;  // numpy < 1.x wrote no version
    if (s && s->size() >= base + 2) {
      n.shape = AsIntList((*s)[base]).value_or(std::vector<int64_t>{});
      n.dtype = NumpyDtype((*s)[base + 1]);
    } else {
      n.dtype.push_back('?');
    }
    out_.numpy.push_back(std::move(n));
  }

  // scalar(dtype, raw bytes).
  void RecordScalar(const Value* v, const std::string& path) {
    const std::vector<Value*>* a = Sequence(v->args);
    NumpyValue n;
    n.path = path;
    n.scalar = true;
    n.dtype = NumpyDtype(a && !a->empty() ? (*a)[0] : nullptr);
    out_.numpy.push_back(std::move(n));
  }

  void CountOpaque(const Value* g) {
    if (!IsOpaque(g)) return;
    std::string name = GlobalPath(g);
    auto [it, inserted] = opaque_index_.emplace(name, out_.opaque_globals.size());
    if (inserted) out_.opaque_globals.push_back({name, 0});
    ++out_.opaque_globals[it->second].count;
  }

  const UnpickleResult& pickle_;
  StorageTable storages_;
  TensorInterpreter tensors_;
  TorchPickle out_;
  std::vector<Frame> stack_;
  std::vector<Frame> pending_;
  std::unordered_set<const Value*> visited_;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, size_t> opaque_index_;
};

}  // namespace

TorchPickle InterpretTorchPickle(const UnpickleResult& pickle) {
  if (!pickle.arena || !pickle.root) throw Error(ErrorKind::kInvalidArgument, "empty unpickle result");
  return Walker(pickle).Run();
}

std::string RenderTorch(const UnpickleResult& pickle, const TorchPickle& model, size_t max_chars) {
  std::unordered_map<uint64_t, const TorchTensor*> by_offset;  // Object nodes have distinct offsets
  for (const TorchTensor& t : model.tensors) by_offset.emplace(t.pickle_offset, &t);
  RenderOverride summary = [&](const Value* v, std::string* out) {
    if (v->kind == Kind::kPersistentId) {
      const std::vector<Value*>* f = Sequence(v->pid);
      if (!f || f->size() < 3) return false;
      out->append("<storage ").append(Render((*f)[2], 2, 256)).append(1, '>');
      return true;
    }
    auto it = v->kind == Kind::kObject ? by_offset.find(v->offset) : by_offset.end();
    if (it == by_offset.end()) return false;
    const TorchTensor& t = *it->second;
    out->append("<tensor '").append(t.name).append("' ").append(DTypeName(t.dtype)).append(1, '[');
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) out->append(", ");
      out->append(std::to_string(t.shape[i]));
    }
    out->append(1, ']');
    if (t.is_parameter) *out += " param";
    if (t.dtensor_local) *out += " dtensor";
    if (t.sharded_local) *out += " shard";
    if (t.quantized) *out += " quantized";
    *out += ">";
    return true;
  };
  return Render(pickle.root, pickle.max_depth, max_chars, summary);
}

}  // namespace zckpt::pickle
