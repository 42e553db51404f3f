#include "pickle/unpickler.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "pickle/bigint.h"
#include "pickle/byte_reader.h"
#include "pickle/data_constructors.h"
#include "pickle/opcodes.h"
#include "pickle/safety.h"
#include "pickle/text_codec.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

namespace {

// The pickle machine: CPython's _Unpickler with every call replaced by an Object node.
// As in Python 3, MARK starts a fresh stack (kept here as a base index), so an opcode can
// never pop below the innermost open MARK.
class Machine {
 public:
  // A pickle cannot legitimately hold more str/bytes payload or container members than about
  // twice its own size (every member is pushed by an opcode of at least a byte; folding
  // set(list) or encode(text) copies once). Past that, memo references are being multiplied.
  Machine(std::span<const uint8_t> bytes, const UnpickleOptions& options)
      : in_(bytes),
        options_(options),
        vetter_(options.globals, options.allow_globals),
        arena_(std::make_shared<ValueArena>()),
        bytes_budget_(std::min<uint64_t>(options.max_total_bytes, 2 * uint64_t{bytes.size()} + (1u << 20))),
        items_budget_(2 * uint64_t{bytes.size()} + (1u << 20)) {}

  UnpickleResult Run() {
    while (true) {
      op_offset_ = in_.pos();
      auto code = in_.U8();
      if (!code) Fail("pickle ended without STOP");
      if (*code == op::kStop) break;
      Step(*code);
    }
    // A reader of a stream (torch.load of a legacy file) takes a frame whole: bytes of the last
    // frame after STOP would be read as part of this pickle there, shifting whatever follows it.
    // Python's pickler ends its last frame right after STOP.
    if (frame_end_ > in_.pos())
      Fail("FRAME claims " + std::to_string(frame_end_ - frame_begin_) + " bytes, but the pickle stops " +
           std::to_string(frame_end_ - in_.pos()) + " bytes before its end");
    UnpickleResult result;
    Value* root = Pop();
    CheckGetattrOnlyFolded(root);
    CheckFinishedDepth(root);
    result.root = root;
    result.end_offset = in_.pos();
    result.arena = std::move(arena_);
    result.globals = std::move(globals_);
    result.max_depth = options_.max_depth;
    return result;
  }

 private:
  // ---- errors ------------------------------------------------------------------------------
  [[noreturn]] void Raise(ErrorKind kind, const std::string& what) const {
    throw Error(kind, "pickle byte offset " + std::to_string(op_offset_) + ": " + what);
  }
  [[noreturn]] void Fail(const std::string& what) const { Raise(ErrorKind::kCorrupt, what); }

  // ---- reading operands --------------------------------------------------------------------
  uint64_t ReadLE(unsigned n, const char* opname) {
    auto v = in_.LittleEndian(n);
    if (!v) Fail(std::string("truncated ") + opname + " argument");
    return *v;
  }
  std::string_view Take(uint64_t n, const char* opname) {
    auto s = in_.Take(n);
    if (!s)
      Fail(std::string(opname) + " claims " + std::to_string(n) + " bytes but only " +
           std::to_string(in_.remaining()) + " remain");
    return *s;
  }
  std::string_view Line(const char* opname) {
    auto s = in_.Line();
    if (!s) Fail(std::string(opname) + " argument is not terminated by a newline");
    return *s;
  }
  std::string_view Utf8Line(const char* opname) {
    std::string_view s = Line(opname);
    if (!IsValidUtf8(s)) Fail(std::string(opname) + " argument is not valid UTF-8");
    return s;
  }

  // ---- nodes -------------------------------------------------------------------------------
  Value* New(Kind kind) {
    if (arena_->size() >= options_.max_nodes)
      Fail("more than " + std::to_string(options_.max_nodes) + " objects (max_nodes)");
    return arena_->New(kind, op_offset_);
  }
  void CountBytes(uint64_t n) {
    total_bytes_ += n;
    if (total_bytes_ > bytes_budget_)
      Fail("more than " + std::to_string(bytes_budget_) + " bytes of str/bytes data (max_total_bytes, or twice the pickle)");
  }
  void CountItems(uint64_t n) {
    total_items_ += n;
    if (total_items_ > items_budget_)
      Fail("more than " + std::to_string(items_budget_) + " container members (twice the pickle's size)");
  }
  Value* NewText(Kind kind, std::string_view text) {
    CountBytes(text.size());
    Value* v = New(kind);
    v->text.assign(text);
    return v;
  }
  Value* NewInt(int64_t i) {
    Value* v = New(Kind::kInt);
    v->integer = i;
    return v;
  }
  Value* NewBool(bool b) {
    Value* v = New(Kind::kBool);
    v->boolean = b;
    return v;
  }
  // An integer from its two's complement bytes: kInt when it fits.
  Value* NewLong(std::string_view le) {
    if (auto i = BigIntToInt64(le)) return NewInt(*i);
    return NewText(Kind::kBigInt, le);
  }
  // `parent` now contains `child`: keep the nesting depth bounded as the tree is built. Only a
  // lower bound: a memo reference lets a pickle grow `child` after this (APPEND to a list adopted
  // while empty), so CheckFinishedDepth measures the finished tree again.
  void Adopt(Value* parent, Value* child) {
    if (parent == child) return;  // a container holding itself adds no depth
    if (child->depth + 1 > parent->depth) parent->depth = child->depth + 1;
    if (parent->depth > options_.max_depth)
      Fail("nesting deeper than " + std::to_string(options_.max_depth) + " (max_depth)");
  }
  Value* NewContainer(Kind kind, std::vector<Value*> items) {
    CountItems(items.size());
    Value* v = New(kind);
    for (Value* item : items) Adopt(v, item);
    v->items = std::move(items);
    return v;
  }

  // ---- stack and marks ---------------------------------------------------------------------
  size_t Base() const { return marks_.empty() ? 0 : marks_.back(); }
  void Push(Value* v) { stack_.push_back(v); }
  Value* Pop() {
    if (stack_.size() <= Base()) Fail("stack underflow");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* Top() {
    if (stack_.size() <= Base()) Fail("stack underflow");
    return stack_.back();
  }
  void Mark() {
    if (marks_.size() >= options_.max_depth)
      Fail("more than " + std::to_string(options_.max_depth) + " open MARKs (max_depth)");
    marks_.push_back(stack_.size());
  }
  std::vector<Value*> PopMark() {
    if (marks_.empty()) Fail("no MARK to pop to");
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }

  // ---- memo --------------------------------------------------------------------------------
  void MemoPut(uint64_t key) {
    Value* v = Top();
    auto it = memo_.find(key);
    if (it != memo_.end()) {
      it->second = v;
      return;
    }
    if (memo_.size() >= options_.max_memo_entries)
      Fail("more than " + std::to_string(options_.max_memo_entries) + " memo entries (max_memo_entries)");
    memo_.emplace(key, v);
  }
  void MemoGet(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) Fail("memo key " + std::to_string(key) + " was never stored");
    Push(it->second);
  }
  uint64_t TextMemoKey(const char* opname) {
    auto k = ParseDecimalInt64(Line(opname));
    if (!k || *k < 0) Fail(std::string("invalid ") + opname + " argument");
    return static_cast<uint64_t>(*k);
  }

  // ---- globals -----------------------------------------------------------------------------
  Value* NewGlobal(std::string_view module, std::string_view name) {
    if (module.empty() || name.empty()) Fail("empty module or name in a global");
    if (IsGetattr(module, name)) {
      // Protocols 0-3 pickle a nested class (ShardedTensor.ProcessGroupState) as
      // getattr(Outer, 'Inner'). Held back, not refused: Reduce() folds that one form into the
      // global `Outer.Inner` (judged like any dotted name); any other use is refused at STOP.
      Value* g = NewText(Kind::kGlobal, module);
      g->name.assign(name);
      getattr_globals_.insert(g);
      return g;
    }
    if (auto why = vetter_.Refusal(module, name)) {
      // Deny-listed globals keep the short message scripts match; the allowlist says how to allow.
      std::string msg = "refused global '" + std::string(module) + "." + std::string(name) +
                        "' at pickle byte offset " + std::to_string(op_offset_);
      if (!IsCodeExecutionGlobal(module, name)) msg += ": " + *why;
      throw Error(ErrorKind::kUnsafe, msg);
    }
    std::string key = std::string(module) + '\n' + std::string(name);
    if (seen_globals_.insert(key).second)
      globals_.push_back({std::string(module), std::string(name), op_offset_});
    Value* g = NewText(Kind::kGlobal, module);
    CountBytes(name.size());
    g->name.assign(name);
    return g;
  }

  // ---- objects -----------------------------------------------------------------------------
  Value* NewObject(ObjectHow how, Value* callable, Value* args, Value* kwargs) {
    Value* o = New(Kind::kObject);
    o->how = how;
    o->callable = callable;
    o->args = args;
    o->kwargs = kwargs;
    for (Value* v : {callable, args, kwargs})
      if (v) Adopt(o, v);
    return o;
  }
  static bool IsGetattr(std::string_view module, std::string_view name) {
    return name == "getattr" && (module == "builtins" || module == "__builtin__");
  }
  // Worded as every refused global is (scripts and tests match it), at the getattr's offset.
  [[noreturn]] void RefuseGetattr(const Value* g) const {
    throw Error(ErrorKind::kUnsafe,
                "refused global '" + g->text + "." + g->name + "' at pickle byte offset " + std::to_string(g->offset));
  }
  // getattr(G, 'Name') with G a global this interpreter accepted and Name a plain public
  // identifier is the global `G.Name`, checked as if written so; nothing else is accepted.
  Value* FoldGetattr(const Value* getattr, const Value* args) {
    const std::vector<Value*>* a = args && args->kind == Kind::kTuple ? &args->items : nullptr;
    const Value* owner = a && a->size() == 2 ? (*a)[0] : nullptr;
    const Value* attr = a && a->size() == 2 ? (*a)[1] : nullptr;
    bool identifier = attr && attr->kind == Kind::kString && !attr->text.empty() &&
                      std::isalpha(static_cast<unsigned char>(attr->text[0]));
    for (char ch : identifier ? attr->text : std::string())
      identifier = identifier && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_');
    if (!owner || owner->kind != Kind::kGlobal || getattr_globals_.count(owner) || !identifier)
      RefuseGetattr(getattr);
    return NewGlobal(owner->text, owner->name + "." + attr->text);
  }
  // Every getattr global must have been consumed by FoldGetattr: none may be reachable.
  void CheckGetattrOnlyFolded(const Value* root) const {
    if (getattr_globals_.empty()) return;
    auto check = [&](const Value* v) {
      if (v && getattr_globals_.count(v)) RefuseGetattr(v);
    };
    check(root);
    for (const Value& v : arena_->nodes()) {
      for (const Value* item : v.items) check(item);
      for (const auto& [k, val] : v.entries) check(k), check(val);
      for (const Value* p : {v.callable, v.args, v.kwargs, v.state, v.pid}) check(p);
    }
  }

  // The children of a node in the order every tree walk takes them: items, dict keys and values,
  // then an object's callable, args, kwargs, state, and a persistent id's pid (nulls included).
  static size_t ChildCount(const Value* v) { return v->items.size() + 2 * v->entries.size() + 5; }
  static Value* Child(const Value* v, size_t i) {
    if (i < v->items.size()) return v->items[i];
    i -= v->items.size();
    if (i < 2 * v->entries.size()) return i % 2 ? v->entries[i / 2].second : v->entries[i / 2].first;
    switch (i - 2 * v->entries.size()) {
      case 0: return v->callable;
      case 1: return v->args;
      case 2: return v->kwargs;
      case 3: return v->state;
      default: return v->pid;
    }
  }

  // Measures the finished tree: every node's `depth` becomes its height (the longest chain below
  // it, itself included; the back edge of a cycle ends a chain), found by one iterative
  // depth-first pass, O(nodes + edges). Refuses a tree higher than max_depth, which is what a
  // pickle reaches by nesting through memo references after the fact (a list adopted while
  // empty and filled later, a dict key, an object's args) and what would overflow the stack
  // of any recursive walk above this layer.
  void CheckFinishedDepth(Value* root) {
    constexpr uint32_t kUnseen = 0, kOnPath = UINT32_MAX;
    for (Value& v : arena_->nodes()) v.depth = kUnseen;
    struct Frame {
      Value* node;
      size_t next;
      uint32_t height;
    };
    std::vector<Frame> path;
    auto too_deep = [&](const Value* v) {
      op_offset_ = v->offset;
      Fail("nesting deeper than " + std::to_string(options_.max_depth) +
           " (max_depth), counted on the finished tree (memo references included)");
    };
    auto enter = [&](Value* v) {
      if (path.size() + 1 > options_.max_depth) too_deep(v);
      v->depth = kOnPath;
      path.push_back({v, 0, 1});
    };
    enter(root);
    while (!path.empty()) {
      Frame& f = path.back();
      if (f.next == ChildCount(f.node)) {
        const uint32_t height = f.height;
        if (height > options_.max_depth) too_deep(f.node);
        f.node->depth = height;
        path.pop_back();
        if (!path.empty()) path.back().height = std::max(path.back().height, height + 1);
        continue;
      }
      Value* child = Child(f.node, f.next++);
      if (!child || child->depth == kOnPath) continue;  // nothing there, or a cycle closing
      if (child->depth != kUnseen) {
        f.height = std::max(f.height, child->depth + 1);
        continue;
      }
      enter(child);
    }
  }

  void Reduce() {
    Value* args = Pop();
    Value* callable = Pop();
    if (getattr_globals_.count(callable)) {
      Push(FoldGetattr(callable, args));
      return;
    }
    auto folded = FoldDataConstructor(callable, args);
    if (!folded) {
      Push(NewObject(ObjectHow::kReduce, callable, args, nullptr));
      return;
    }
    Value* v;
    if (folded->kind == Kind::kBytes) {
      v = NewText(Kind::kBytes, folded->bytes);
      v->bytearray = folded->bytearray;
    } else {
      v = NewContainer(folded->kind, std::move(folded->items));
    }
    Push(v);
  }
  void Build() {
    Value* state = Pop();
    Value* target = Top();
    if (target->kind != Kind::kObject) Fail("BUILD on a " + std::string(KindName(target->kind)));
    target->state = state;
    Adopt(target, state);
  }
  // APPEND/APPENDS/ADDITEMS: list.append, set.add, or an object's append/add (list and set
  // subclasses), kept in `items`.
  void AddItems(std::vector<Value*> items, const char* opname, bool set_op) {
    Value* target = Top();
    bool ok = target->kind == Kind::kObject || (set_op ? target->kind == Kind::kSet : target->kind == Kind::kList);
    if (!ok) Fail(std::string(opname) + " to a " + std::string(KindName(target->kind)));
    CountItems(items.size());
    for (Value* v : items) Adopt(target, v);
    target->items.insert(target->items.end(), items.begin(), items.end());
  }
  void SetItems(const std::vector<Value*>& kv, const char* opname) {
    if (kv.size() % 2) Fail(std::string(opname) + " with an odd number of keys and values");
    Value* target = Top();
    if (target->kind != Kind::kDict && target->kind != Kind::kObject)
      Fail(std::string(opname) + " on a " + std::string(KindName(target->kind)));
    CountItems(kv.size());
    for (size_t i = 0; i < kv.size(); i += 2) {
      Adopt(target, kv[i]);
      Adopt(target, kv[i + 1]);
      target->entries.emplace_back(kv[i], kv[i + 1]);
    }
  }

  // Python's int() refuses decimal text beyond int_max_str_digits (4300 by default), so its
  // unpickler refuses such a literal too; the bound also keeps the conversion cheap.
  void CheckDecimalDigits(std::string_view s, const char* opname) {
    if (s.size() > kMaxDecimalDigits + 1)  // + 1: a sign
      Fail(std::string(opname) + " literal of " + std::to_string(s.size()) + " characters: more than " +
           std::to_string(kMaxDecimalDigits) + " digits (Python's int_max_str_digits refuses it as well)");
  }

  // ---- strings -----------------------------------------------------------------------------
  Value* NewUnicode(std::string_view utf8, const char* opname) {
    if (!IsValidUtf8(utf8)) Fail(std::string(opname) + " payload is not valid UTF-8");
    return NewText(Kind::kString, utf8);
  }
  // Python 2 `str` (STRING/BINSTRING/SHORT_BINSTRING): text when it is UTF-8 (torch loads
  // these with encoding='utf-8'), the raw bytes otherwise.
  Value* NewPy2String(std::string_view raw) {
    return NewText(IsValidUtf8(raw) ? Kind::kString : Kind::kBytes, raw);
  }
  Value* NewBytes(std::string_view raw, bool bytearray) {
    Value* v = NewText(Kind::kBytes, raw);
    v->bytearray = bytearray;
    return v;
  }

  // ---- one opcode --------------------------------------------------------------------------
  void Step(uint8_t code);
  void StepText(uint8_t code);
  void StepCall(uint8_t code);

  ByteReader in_;
  uint64_t frame_begin_ = 0, frame_end_ = 0;  // the last FRAME's bytes
  const UnpickleOptions& options_;
  const GlobalVetter vetter_;
  std::shared_ptr<ValueArena> arena_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
  std::vector<GlobalRef> globals_;
  std::unordered_set<std::string> seen_globals_;
  std::unordered_set<const Value*> getattr_globals_;  // held back by NewGlobal, see FoldGetattr
  const uint64_t bytes_budget_;
  const uint64_t items_budget_;
  uint64_t total_bytes_ = 0;
  uint64_t total_items_ = 0;
  uint64_t op_offset_ = 0;
};

// Protocol 0's newline-terminated text opcodes.
void Machine::StepText(uint8_t code) {
  switch (code) {
    case op::kInt: {
      std::string_view s = Line("INT");
      if (s == "00") return Push(NewBool(false));
      if (s == "01") return Push(NewBool(true));
      if (auto i = ParseDecimalInt64(s)) return Push(NewInt(*i));
      CheckDecimalDigits(s, "INT");
      auto big = DecimalToBigInt(s);
      if (!big) Fail("invalid INT literal");
      return Push(NewLong(*big));
    }
    case op::kLong: {
      std::string_view s = Line("LONG");
      if (!s.empty() && s.back() == 'L') s.remove_suffix(1);
      CheckDecimalDigits(s, "LONG");
      auto big = DecimalToBigInt(s);
      if (!big) Fail("invalid LONG literal");
      return Push(NewLong(*big));
    }
    case op::kFloat: {
      auto f = ParseFloatText(Line("FLOAT"));
      if (!f) Fail("invalid FLOAT literal");
      Value* v = New(Kind::kFloat);
      v->real = *f;
      return Push(v);
    }
    case op::kString: {
      std::string why;
      auto s = DecodeStringLine(Line("STRING"), &why);
      if (!s) Fail(why);
      return Push(NewPy2String(*s));
    }
    case op::kUnicode: {
      std::string why;
      auto s = DecodeRawUnicodeEscape(Line("UNICODE"), &why);
      if (!s) Fail(why);
      return Push(NewText(Kind::kString, *s));
    }
    case op::kPersId: {
      std::string_view s = Line("PERSID");
      for (char c : s)
        if (static_cast<unsigned char>(c) >= 0x80) Fail("persistent IDs in protocol 0 must be ASCII strings");
      Value* p = New(Kind::kPersistentId);
      p->pid = NewText(Kind::kString, s);
      return Push(p);
    }
    case op::kGet: return MemoGet(TextMemoKey("GET"));
    case op::kPut: return MemoPut(TextMemoKey("PUT"));
    case op::kGlobal: {
      std::string module(Utf8Line("GLOBAL"));
      std::string_view name = Utf8Line("GLOBAL");
      return Push(NewGlobal(module, name));
    }
    case op::kInst: {
      std::string module(Utf8Line("INST"));
      std::string_view name = Utf8Line("INST");
      Value* cls = NewGlobal(module, name);
      Value* args = NewContainer(Kind::kTuple, PopMark());
      return Push(NewObject(ObjectHow::kInst, cls, args, nullptr));
    }
  }
  Fail("internal: not a text opcode");
}

// Opcodes that describe a call (never made).
void Machine::StepCall(uint8_t code) {
  switch (code) {
    case op::kReduce: return Reduce();
    case op::kNewObj: {
      Value* args = Pop();
      Value* cls = Pop();
      return Push(NewObject(ObjectHow::kNewObj, cls, args, nullptr));
    }
    case op::kNewObjEx: {
      Value* kwargs = Pop();
      Value* args = Pop();
      Value* cls = Pop();
      return Push(NewObject(ObjectHow::kNewObjEx, cls, args, kwargs));
    }
    case op::kObj: {
      std::vector<Value*> items = PopMark();
      if (items.empty()) Fail("OBJ without a class");
      Value* cls = items.front();
      Value* args = NewContainer(Kind::kTuple, std::vector<Value*>(items.begin() + 1, items.end()));
      return Push(NewObject(ObjectHow::kObj, cls, args, nullptr));
    }
    case op::kBuild: return Build();
    case op::kStackGlobal: {
      Value* name = Pop();
      Value* module = Pop();
      if (module->kind != Kind::kString || name->kind != Kind::kString) Fail("STACK_GLOBAL requires str");
      return Push(NewGlobal(module->text, name->text));
    }
    case op::kBinPersId: {
      Value* p = New(Kind::kPersistentId);
      p->pid = Pop();
      Adopt(p, p->pid);
      return Push(p);
    }
  }
  Fail("internal: not a call opcode");
}

void Machine::Step(uint8_t code) {
  switch (code) {
    // -- framing and protocol
    case op::kProto: {
      uint64_t proto = ReadLE(1, "PROTO");
      if (proto > static_cast<uint64_t>(op::kHighestProtocol))
        Raise(ErrorKind::kUnsupported, "unsupported pickle protocol " + std::to_string(proto));
      return;
    }
    case op::kFrame: {
      uint64_t n = ReadLE(8, "FRAME");
      if (n > in_.remaining())
        Fail("FRAME claims " + std::to_string(n) + " bytes but only " + std::to_string(in_.remaining()) + " remain");
      frame_begin_ = in_.pos();
      frame_end_ = in_.pos() + n;
      return;  // frames only group opcodes; their contents are read as usual
    }
    // -- constants and numbers
    case op::kNone: return Push(New(Kind::kNone));
    case op::kNewTrue: return Push(NewBool(true));
    case op::kNewFalse: return Push(NewBool(false));
    case op::kBinInt: return Push(NewInt(static_cast<int32_t>(ReadLE(4, "BININT"))));
    case op::kBinInt1: return Push(NewInt(static_cast<int64_t>(ReadLE(1, "BININT1"))));
    case op::kBinInt2: return Push(NewInt(static_cast<int64_t>(ReadLE(2, "BININT2"))));
    case op::kLong1: return Push(NewLong(Take(ReadLE(1, "LONG1"), "LONG1")));
    case op::kLong4: {
      auto n = static_cast<int32_t>(ReadLE(4, "LONG4"));
      if (n < 0) Fail("LONG4 has a negative byte count");
      return Push(NewLong(Take(static_cast<uint64_t>(n), "LONG4")));
    }
    case op::kBinFloat: {
      auto bits = in_.BigEndian(8);
      if (!bits) Fail("truncated BINFLOAT argument");
      Value* v = New(Kind::kFloat);
      v->real = std::bit_cast<double>(*bits);
      return Push(v);
    }
    // -- strings and bytes
    case op::kBinString: {
      auto n = static_cast<int32_t>(ReadLE(4, "BINSTRING"));
      if (n < 0) Fail("BINSTRING has a negative byte count");
      return Push(NewPy2String(Take(static_cast<uint64_t>(n), "BINSTRING")));
    }
    case op::kShortBinString: return Push(NewPy2String(Take(ReadLE(1, "SHORT_BINSTRING"), "SHORT_BINSTRING")));
    case op::kBinUnicode: return Push(NewUnicode(Take(ReadLE(4, "BINUNICODE"), "BINUNICODE"), "BINUNICODE"));
    case op::kShortBinUnicode:
      return Push(NewUnicode(Take(ReadLE(1, "SHORT_BINUNICODE"), "SHORT_BINUNICODE"), "SHORT_BINUNICODE"));
    case op::kBinUnicode8: return Push(NewUnicode(Take(ReadLE(8, "BINUNICODE8"), "BINUNICODE8"), "BINUNICODE8"));
    case op::kBinBytes: return Push(NewBytes(Take(ReadLE(4, "BINBYTES"), "BINBYTES"), false));
    case op::kShortBinBytes: return Push(NewBytes(Take(ReadLE(1, "SHORT_BINBYTES"), "SHORT_BINBYTES"), false));
    case op::kBinBytes8: return Push(NewBytes(Take(ReadLE(8, "BINBYTES8"), "BINBYTES8"), false));
    case op::kByteArray8: return Push(NewBytes(Take(ReadLE(8, "BYTEARRAY8"), "BYTEARRAY8"), true));
    case op::kNextBuffer:
    case op::kReadonlyBuffer:
      Raise(ErrorKind::kUnsupported, "out-of-band buffers (NEXT_BUFFER/READONLY_BUFFER) are not supported");
    // -- containers
    case op::kEmptyTuple: return Push(NewContainer(Kind::kTuple, {}));
    case op::kTuple1:
    case op::kTuple2:
    case op::kTuple3: {
      std::vector<Value*> items(code - op::kTuple1 + 1);
      for (size_t i = items.size(); i-- > 0;) items[i] = Pop();
      return Push(NewContainer(Kind::kTuple, std::move(items)));
    }
    case op::kTuple: return Push(NewContainer(Kind::kTuple, PopMark()));
    case op::kEmptyList: return Push(NewContainer(Kind::kList, {}));
    case op::kList: return Push(NewContainer(Kind::kList, PopMark()));
    case op::kEmptyDict: return Push(New(Kind::kDict));
    case op::kDict: {
      std::vector<Value*> kv = PopMark();
      Push(New(Kind::kDict));
      return SetItems(kv, "DICT");
    }
    case op::kEmptySet: return Push(NewContainer(Kind::kSet, {}));
    case op::kFrozenSet: return Push(NewContainer(Kind::kFrozenSet, PopMark()));
    case op::kAppend: {
      Value* v = Pop();
      return AddItems({v}, "APPEND", false);
    }
    case op::kAppends: return AddItems(PopMark(), "APPENDS", false);
    case op::kAddItems: return AddItems(PopMark(), "ADDITEMS", true);
    case op::kSetItem: {
      Value* value = Pop();
      Value* key = Pop();
      return SetItems({key, value}, "SETITEM");
    }
    case op::kSetItems: return SetItems(PopMark(), "SETITEMS");
    // -- stack
    case op::kMark: return Mark();
    case op::kPop:
      if (stack_.size() > Base()) stack_.pop_back();
      else PopMark();  // as CPython: POP right after MARK discards the mark
      return;
    case op::kPopMark: PopMark(); return;
    case op::kDup: return Push(Top());
    // -- memo
    case op::kBinGet: return MemoGet(ReadLE(1, "BINGET"));
    case op::kLongBinGet: return MemoGet(ReadLE(4, "LONG_BINGET"));
    case op::kBinPut: return MemoPut(ReadLE(1, "BINPUT"));
    case op::kLongBinPut: return MemoPut(ReadLE(4, "LONG_BINPUT"));
    case op::kMemoize: return MemoPut(memo_.size());
    // -- extension registry (process-local in Python; nothing is registered here)
    case op::kExt1:
    case op::kExt2:
    case op::kExt4: {
      uint64_t ext = ReadLE(code == op::kExt1 ? 1 : code == op::kExt2 ? 2 : 4, "EXT");
      Raise(ErrorKind::kUnsupported, "extension code " + std::to_string(ext) + " (EXT opcodes) is not registered");
    }
    case op::kInt: case op::kLong: case op::kFloat: case op::kString: case op::kUnicode:
    case op::kPersId: case op::kGet: case op::kPut: case op::kGlobal: case op::kInst:
      return StepText(code);
    case op::kReduce: case op::kNewObj: case op::kNewObjEx: case op::kObj: case op::kBuild:
    case op::kStackGlobal: case op::kBinPersId:
      return StepCall(code);
  }
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", code);
  Fail(std::string("unknown opcode ") + hex);
}

}  // namespace

UnpickleResult Unpickle(std::span<const uint8_t> bytes, const UnpickleOptions& options) {
  return Machine(bytes, options).Run();
}

}  // namespace zckpt::pickle
