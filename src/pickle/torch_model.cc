#include "pickle/torch_model.h"

#include <unordered_map>
#include <unordered_set>

#include "pickle/torch_paths.h"
#include "pickle/torch_storages.h"
#include "pickle/torch_tensors.h"
#include "pickle/torch_values.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

namespace {

// Budget for tensor and numpy records (names, shapes) together: a small pickle can reach one
// tensor through the memo many times, or sit tensors under huge shared keys.
constexpr size_t kMaxNameBytes = 64 * 1024;
constexpr uint64_t kMaxRecordBytes = uint64_t{256} << 20;

bool IsNumpyCall(const Value* obj, std::string_view name) {
  const Value* g = ObjectGlobal(obj);
  return g && g->name == name && (g->text == "numpy" || g->text.rfind("numpy.", 0) == 0);
}

// numpy's dtype.str for a `numpy.dtype(kind, align, copy)` object with its BUILD state
// (version, byteorder, ...): "<u4", "|b1".
std::string NumpyDtype(const Value* dtype) {
  const std::vector<Value*>* args = dtype ? Sequence(dtype->args) : nullptr;
  auto code = args && !args->empty() ? AsShortText((*args)[0]) : std::nullopt;
  if (!code) return "?";
  const std::vector<Value*>* state = Sequence(dtype->state);
  auto order = state && state->size() > 1 ? AsShortText((*state)[1]) : std::nullopt;
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
    Push(pickle_.root, PathTable::kRoot, 0);
    Flush(0);
    while (!stack_.empty()) {
      Frame f = stack_.back();
      stack_.pop_back();
      Visit(f);
    }
    out_.storages = storages_.TakeStorages();
    return std::move(out_);
  }

 private:
  using Path = PathTable::Id;

  struct Frame {
    const Value* node;
    Path path;
    uint32_t depth;
    bool is_state;  // an object's BUILD state: attributes sit directly under `path`
    bool internal;  // under another tensor's metadata: tensors found here are internal
  };

  // Children are collected in order, then pushed reversed so the walk is depth-first in
  // pickle order.
  void Push(const Value* node, Path path, uint32_t depth, bool is_state = false) {
    if (node) pending_.push_back({node, path, depth, is_state, internal_});
  }
  void Flush(size_t first) {
    for (size_t i = pending_.size(); i-- > first;) stack_.push_back(pending_[i]);
    pending_.resize(first);
  }

  [[noreturn]] void Fail(const std::string& what, Path path) const {
    throw Error(ErrorKind::kCorrupt, what + " at '" + paths_.Display(path) + "'");
  }

  void Visit(const Frame& f) {
    if (f.depth > pickle_.max_depth) Fail("object tree deeper than " + std::to_string(pickle_.max_depth), f.path);
    const size_t first = pending_.size();
    internal_ = f.internal;
    if (f.is_state) PushState(f.node, f.path, f.depth);
    else if (visited_.insert(f.node).second) VisitNode(f.node, f.path, f.depth);
    else NameAgain(f.node, f.path);
    Flush(first);
  }

  void VisitNode(const Value* v, Path path, uint32_t depth) {
    switch (v->kind) {
      case Kind::kDict: return PushEntries(v, path, depth);
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
      case Kind::kFrozenSet: return PushItems(v->items, path, depth);
      case Kind::kGlobal: return CountOpaque(v);
      case Kind::kObject: return VisitObject(v, path, depth);
      default: return;
    }
  }

  void PushItems(const std::vector<Value*>& items, Path path, uint32_t depth) {
    for (size_t i = 0; i < items.size(); ++i) Push(items[i], paths_.Index(path, i), depth + 1);
  }
  void PushEntries(const Value* v, Path path, uint32_t depth) {
    for (const auto& [k, val] : v->entries) Push(val, paths_.Key(path, k), depth + 1);
  }

  void VisitObject(const Value* v, Path path, uint32_t depth) {
    if (TensorInterpreter::IsRebuildCall(v)) {
      std::string where = path == PathTable::kRoot ? "tensor" : paths_.Display(path);
      if (auto found = tensors_.Interpret(v, where)) return Record(*found, v, path, depth);
    }
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
      PushItems(*args, path, depth);
    } else if (v->args) {
      Push(v->args, path, depth + 1);
    }
    if (v->kwargs) PushState(v->kwargs, path, depth);
    PushItems(v->items, path, depth);
    PushEntries(v, path, depth);
    if (v->state) Push(v->state, path, depth + 1, true);
  }

  // An object state: a dict or (dict, slots) tuple puts its attributes at `path.attr`.
  void PushState(const Value* state, Path path, uint32_t depth) {
    std::vector<const Value*> dicts = StateDicts(state);
    if (dicts.empty()) return Push(state, path, depth + 1);
    if (!visited_.insert(state).second) return;
    for (const Value* dict : dicts)
      if (dict == state || visited_.insert(dict).second) PushEntries(dict, path, depth);
  }

  // The name for a record at `path` + `suffix`, unique, charged to the record budget.
  std::string NameFor(Path path, const std::string& suffix, size_t dims) {
    Path at = paths_.Literal(path, suffix);
    auto text = paths_.Text(at, kMaxNameBytes);
    if (!text) Fail("tensor name longer than " + std::to_string(kMaxNameBytes) + " bytes", at);
    record_bytes_ += text->size() + 16 * dims + sizeof(TorchTensor);
    if (record_bytes_ > kMaxRecordBytes)
      Fail("tensor and numpy records exceed " + std::to_string(kMaxRecordBytes) + " bytes", at);
    return UniqueName(text->empty() ? "tensor" : *text);
  }

  void Record(TensorFinding& found, const Value* node, Path path, uint32_t depth) {
    for (const Value* c : found.consumed) visited_.insert(c);
    auto& recorded = recorded_[node];
    for (auto& named : found.tensors) {
      named.tensor.name = NameFor(path, named.suffix, named.tensor.shape.size());
      named.tensor.pickle_offset = node->offset;
      named.tensor.internal = internal_;
      recorded.push_back({named.suffix, out_.tensors.size()});
      out_.tensors.push_back(std::move(named.tensor));
    }
    const bool outer = internal_;
    for (const auto& more : found.walk) {
      internal_ = outer || more.internal;
      Push(more.node, paths_.Literal(path, more.suffix), depth + 1, more.is_state);
    }
    internal_ = outer;
  }

  // A tensor the memo shares under a second path (tied weights saved under two names, as
  // `named_parameters(remove_duplicate=False)` gives them): one more record for the same view,
  // so a loader matching names finds it under both. The storage is still described once.
  void NameAgain(const Value* node, Path path) {
    auto it = recorded_.find(node);
    if (it == recorded_.end()) return;
    for (const auto& [suffix, index] : it->second) {
      TorchTensor alias = out_.tensors[index];
      alias.name = NameFor(path, suffix, alias.shape.size());
      alias.internal = alias.internal || internal_;
      out_.tensors.push_back(std::move(alias));
    }
  }

  // `base`, or `base~N` with the smallest N not taken yet. The next N to try is kept per base, so
  // a tensor reached under many equal keys costs O(1) per name, not a search from ~1 each time.
  std::string UniqueName(const std::string& base) {
    if (names_.insert(base).second) return base;
    size_t& n = next_suffix_[base];
    while (true) {
      std::string candidate = base + "~" + std::to_string(++n);
      if (names_.insert(candidate).second) return candidate;
    }
  }

  std::string NumpyPath(Path path, size_t dims) {
    auto text = paths_.Text(path, kMaxNameBytes);
    if (!text) Fail("numpy value path longer than " + std::to_string(kMaxNameBytes) + " bytes", path);
    record_bytes_ += text->size() + 8 * dims + sizeof(NumpyValue);
    if (record_bytes_ > kMaxRecordBytes)
      Fail("tensor and numpy records exceed " + std::to_string(kMaxRecordBytes) + " bytes", path);
    return *text;
  }

  // ndarray: _reconstruct(ndarray, (0,), b'b') + BUILD (version, shape, dtype, fortran, data).
  void RecordArray(const Value* v, Path path) {
    NumpyValue n;
    const std::vector<Value*>* s = Sequence(v->state);
    size_t base = s && s->size() == 5 ? 1 : 0;  // numpy < 1.x wrote no version
    if (s && s->size() >= base + 2) {
      n.shape = AsIntList((*s)[base]).value_or(std::vector<int64_t>{});
      n.dtype = NumpyDtype((*s)[base + 1]);
    } else {
      n.dtype.push_back('?');
    }
    n.path = NumpyPath(path, n.shape.size());
    out_.numpy.push_back(std::move(n));
  }

  // scalar(dtype, raw bytes).
  void RecordScalar(const Value* v, Path path) {
    const std::vector<Value*>* a = Sequence(v->args);
    NumpyValue n;
    n.path = NumpyPath(path, 0);
    n.scalar = true;
    n.dtype = NumpyDtype(a && !a->empty() ? (*a)[0] : nullptr);
    out_.numpy.push_back(std::move(n));
  }

  void CountOpaque(const Value* g) {
    if (!IsOpaque(g)) return;
    std::string name = ShortGlobalPath(g);
    auto [it, inserted] = opaque_index_.emplace(name, out_.opaque_globals.size());
    if (inserted) out_.opaque_globals.push_back({name, 0});
    ++out_.opaque_globals[it->second].count;
  }

  const UnpickleResult& pickle_;
  StorageTable storages_;
  TensorInterpreter tensors_;
  PathTable paths_;
  TorchPickle out_;
  std::vector<Frame> stack_;
  std::vector<Frame> pending_;
  std::unordered_set<const Value*> visited_;
  // Tensors each rebuild node produced: (suffix, index into out_.tensors), for NameAgain.
  std::unordered_map<const Value*, std::vector<std::pair<std::string, size_t>>> recorded_;
  bool internal_ = false;  // the frame being visited is under another tensor's metadata
  uint64_t record_bytes_ = 0;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, size_t> next_suffix_;  // base -> last N given as base~N
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
