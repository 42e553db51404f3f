// The object tree a pickle describes, built without running any of it.
//
// One Value per pickled object. Nodes live in a ValueArena and point at each other with plain
// pointers, so a memo reference (BINGET) is the same node in two places and cycles (a list that
// contains itself) are representable; destroying the arena never recurses through the tree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zckpt::pickle {

enum class Kind : uint8_t {
  kNone,
  kBool,
  kInt,           // fits int64
  kBigInt,        // LONG1/LONG4/INT/LONG beyond int64: little-endian two's complement in `text`
  kFloat,
  kString,        // UTF-8 in `text`
  kBytes,         // raw bytes in `text`; `bytearray` set for bytearray objects
  kTuple,         // `items`
  kList,          // `items`
  kDict,          // `entries`, in insertion order
  kSet,           // `items`
  kFrozenSet,     // `items`
  kGlobal,        // `text` = module, `name` = qualified name (GLOBAL, STACK_GLOBAL, INST)
  kPersistentId,  // `pid` = the wrapped value (PERSID, BINPERSID)
  kObject,        // a call never made: `callable`(`args`, **`kwargs`) + later APPENDs/SETITEMs/BUILD
};

// Which opcode produced an Object (callable/args mean the same for all of them).
enum class ObjectHow : uint8_t { kReduce, kNewObj, kNewObjEx, kInst, kObj };

struct Value {
  Kind kind = Kind::kNone;
  bool boolean = false;    // kBool
  bool bytearray = false;  // kBytes: came from a bytearray
  ObjectHow how = ObjectHow::kReduce;
  // Height: the longest chain of nodes from this one down, itself included (a leaf is 1; the back
  // edge of a cycle ends a chain). A lower bound while the pickle is read, exact once Unpickle
  // returns; never more than UnpickleOptions::max_depth.
  uint32_t depth = 1;
  uint64_t offset = 0;     // pickle byte offset of the opcode that created the node
  int64_t integer = 0;     // kInt
  double real = 0;         // kFloat
  std::string text;        // kString, kBytes, kBigInt, kGlobal (module)
  std::string name;        // kGlobal
  std::vector<Value*> items;                        // tuple/list/set members; object APPEND(S)
  std::vector<std::pair<Value*, Value*>> entries;   // dict pairs; object SETITEM(S)
  Value* callable = nullptr;  // kObject
  Value* args = nullptr;      // kObject (normally a kTuple)
  Value* kwargs = nullptr;    // kObject from NEWOBJ_EX (normally a kDict)
  Value* state = nullptr;     // kObject after BUILD (the last one when BUILD repeats)
  Value* pid = nullptr;       // kPersistentId
};

// Owns every node of one tree. A deque keeps node addresses stable while it grows.
class ValueArena {
 public:
  Value* New(Kind kind, uint64_t offset) {
    Value& v = nodes_.emplace_back();
    v.kind = kind;
    v.offset = offset;
    return &v;
  }
  size_t size() const { return nodes_.size(); }
  // Every node in creation order, i.e. in the order the pickle built them.
  const std::deque<Value>& nodes() const { return nodes_; }
  std::deque<Value>& nodes() { return nodes_; }

 private:
  std::deque<Value> nodes_;
};

std::string_view KindName(Kind kind);

// Small readers used by the interpreters above this layer; null-safe.
bool IsGlobal(const Value* v, std::string_view module, std::string_view name);
// "module.name" of a kGlobal, "" for anything else.
std::string GlobalPath(const Value* v);
// The callable of a kObject when it is a kGlobal, else nullptr.
const Value* ObjectGlobal(const Value* v);
// Members of a kTuple or kList, nullptr for anything else.
const std::vector<Value*>* Sequence(const Value* v);
// The value stored under string key `key` in a kDict (or a kObject's SETITEMs), else nullptr.
const Value* DictGet(const Value* v, std::string_view key);

// Python-like one-line rendering, for tests and listings:
//   None True 12 -3 1.5 nan inf 1e+16   'text' (\\ \' \n \r \t \xNN escaped; UTF-8 as is)
//   b'\x00ab'  bytearray(b'x')  (1,)  [1, 2]  {'a': 1}  {1, 2}  set()  frozenset({1})
//   module.name                 a global
//   persid(('storage', ...))    a persistent id
//   f(a, b, **{'k': v})         an object: callable rendered, then its args (`*x` when the args
//                               are not a tuple) and kwargs; then `.extend([..])` for APPENDs,
//                               `.update({..})` for SETITEMs, `.__setstate__(s)` for BUILD.
//   OrderedDict({'a': 1})       collections.OrderedDict() with SETITEMs (torch's state dicts)
// A node already being rendered (a cycle) shows as [...], {...}, (...) or <...>; nesting deeper
// than `max_depth` (at most kMaxRenderDepth, whatever is asked: rendering recurses on the C++
// stack) shows as `...`, and so does everything after the first `max_chars` characters
// (memo sharing lets a few bytes of pickle describe an exponentially large rendering).
// `override`, when given, may render a node itself: it appends to *out and returns true.
using RenderOverride = std::function<bool(const Value*, std::string* out)>;
inline constexpr size_t kMaxRenderDepth = 1000;
std::string Render(const Value* v, size_t max_depth = 1000, size_t max_chars = size_t{1} << 24,
                   const RenderOverride& override = nullptr);

// Python float repr (shortest round trip, exponent form outside 1e-4 <= |x| < 1e16).
std::string FormatFloat(double x);

}  // namespace zckpt::pickle
