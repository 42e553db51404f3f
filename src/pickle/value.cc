#include "pickle/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "pickle/bigint.h"

namespace zckpt::pickle {

std::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kBigInt: return "bigint";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kFrozenSet: return "frozenset";
    case Kind::kGlobal: return "global";
    case Kind::kPersistentId: return "persistent id";
    case Kind::kObject: return "object";
  }
  return "?";
}

bool IsGlobal(const Value* v, std::string_view module, std::string_view name) {
  return v && v->kind == Kind::kGlobal && v->text == module && v->name == name;
}

std::string GlobalPath(const Value* v) {
  if (!v || v->kind != Kind::kGlobal) return "";
  return v->text + "." + v->name;
}

const Value* ObjectGlobal(const Value* v) {
  if (!v || v->kind != Kind::kObject || !v->callable || v->callable->kind != Kind::kGlobal) return nullptr;
  return v->callable;
}

const std::vector<Value*>* Sequence(const Value* v) {
  if (!v || (v->kind != Kind::kTuple && v->kind != Kind::kList)) return nullptr;
  return &v->items;
}

const Value* DictGet(const Value* v, std::string_view key) {
  if (!v || (v->kind != Kind::kDict && v->kind != Kind::kObject)) return nullptr;
  for (const auto& [k, val] : v->entries)
    if (k && k->kind == Kind::kString && k->text == key) return val;
  return nullptr;
}

std::string FormatFloat(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));  // e.g. "-1.25e-05"
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits.push_back(c);
  int exp = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+'), sci.data() + sci.size(), exp);
  if (exp < -4 || exp >= 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) out.append(1, '.').append(digits, 1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out.append(e);
  }
  if (exp < 0) {
    out.append("0.").append(static_cast<size_t>(-exp - 1), '0').append(digits);
    return out;
  }
  size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) {
    out.append(digits).append(int_len - digits.size(), '0').append(".0");
    return out;
  }
  out.append(digits, 0, int_len).append(1, '.').append(digits, int_len);
  return out;
}

namespace {

// Python-style quoting; `bytes` escapes everything outside printable ASCII, text keeps UTF-8.
// At most `limit` bytes of `s` are shown (cut on a UTF-8 boundary), then "...".
std::string Quote(std::string_view s, bool bytes, size_t limit) {
  bool cut = s.size() > limit;
  if (cut) {
    size_t n = limit;
    while (!bytes && n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;
    s = s.substr(0, n);
  }
  std::string out = "'";
  for (char ch : s) {
    auto c = static_cast<uint8_t>(ch);
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\'': out += "\\'"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F || (bytes && c >= 0x80)) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\x%02x", c);
          out += hex;
        } else {
          out.push_back(ch);
        }
    }
  }
  if (cut) out += "...";
  out.push_back('\'');
  return out;
}

bool IsOrderedDict(const Value* v) {
  const Value* g = ObjectGlobal(v);
  return g && g->text == "collections" && g->name == "OrderedDict" && v->items.empty() && !v->kwargs &&
         (!v->args || (v->args->kind == Kind::kTuple && v->args->items.empty()));
}

class Renderer {
 public:
  Renderer(size_t max_depth, size_t max_chars, const RenderOverride& override)
      : max_depth_(max_depth), max_chars_(max_chars), override_(override) {}

  void Node(const Value* v) {
    // Shared subtrees render once per reference, so a small pickle can describe an enormous
    // rendering: stop at the budget.
    if (out_.size() >= max_chars_) {
      if (!truncated_) out_ += "...";
      truncated_ = true;
      return;
    }
    if (!v) { out_ += "<null>"; return; }
    if (override_ && override_(v, &out_)) return;
    if (std::find(active_.begin(), active_.end(), v) != active_.end()) {
      out_ += CycleMark(v->kind);
      return;
    }
    if (active_.size() >= max_depth_) { out_ += "..."; return; }
    active_.push_back(v);
    Body(v);
    active_.pop_back();
  }

  std::string Take() { return std::move(out_); }

 private:
  static const char* CycleMark(Kind k) {
    switch (k) {
      case Kind::kList: return "[...]";
      case Kind::kDict: case Kind::kSet: return "{...}";
      case Kind::kTuple: return "(...)";
      default: return "<...>";
    }
  }

  // Characters left before max_chars (strings are cut to it).
  size_t Budget() const { return max_chars_ > out_.size() ? max_chars_ - out_.size() : 0; }

  void Join(const std::vector<Value*>& items) {
    for (size_t i = 0; i < items.size() && !truncated_; ++i) {
      if (i) out_ += ", ";
      Node(items[i]);
    }
  }

  void Pairs(const std::vector<std::pair<Value*, Value*>>& entries) {
    out_ += "{";
    for (size_t i = 0; i < entries.size() && !truncated_; ++i) {
      if (i) out_ += ", ";
      Node(entries[i].first);
      out_ += ": ";
      Node(entries[i].second);
    }
    out_ += "}";
  }

  void Body(const Value* v) {
    switch (v->kind) {
      case Kind::kNone: out_ += "None"; break;
      case Kind::kBool: out_ += v->boolean ? "True" : "False"; break;
      case Kind::kInt: out_ += std::to_string(v->integer); break;
      case Kind::kBigInt: out_ += BigIntToDecimal(v->text); break;
      case Kind::kFloat: out_ += FormatFloat(v->real); break;
      case Kind::kString: out_ += Quote(v->text, false, Budget()); break;
      case Kind::kBytes:
        out_ += v->bytearray ? "bytearray(b" : "b";
        out_ += Quote(v->text, true, Budget());
        if (v->bytearray) out_ += ')';
        break;
      case Kind::kTuple:
        out_ += "(";
        Join(v->items);
        out_ += v->items.size() == 1 ? ",)" : ")";
        break;
      case Kind::kList: out_ += "["; Join(v->items); out_ += "]"; break;
      case Kind::kDict: Pairs(v->entries); break;
      case Kind::kSet:
        if (v->items.empty()) { out_ += "set()"; break; }
        out_ += "{"; Join(v->items); out_ += "}";
        break;
      case Kind::kFrozenSet:
        out_ += "frozenset(";
        if (!v->items.empty()) { out_ += "{"; Join(v->items); out_ += "}"; }
        out_ += ")";
        break;
      case Kind::kGlobal: out_ += v->text + "." + v->name; break;
      case Kind::kPersistentId: out_ += "persid("; Node(v->pid); out_ += ")"; break;
      case Kind::kObject: Object(v); break;
    }
  }

  void Object(const Value* v) {
    if (IsOrderedDict(v)) {
      out_ += "OrderedDict(";
      Pairs(v->entries);
      out_ += ")";
    } else {
      Call(v);
      if (!v->items.empty()) { out_ += ".extend(["; Join(v->items); out_ += "])"; }
      if (!v->entries.empty()) { out_ += ".update("; Pairs(v->entries); out_ += ")"; }
    }
    if (v->state) { out_ += ".__setstate__("; Node(v->state); out_ += ")"; }
  }

  void Call(const Value* v) {
    Node(v->callable);
    out_ += "(";
    bool any = false;
    if (v->args && v->args->kind == Kind::kTuple) {
      Join(v->args->items);
      any = !v->args->items.empty();
    } else if (v->args) {
      out_ += "*";
      Node(v->args);
      any = true;
    }
    if (v->kwargs) {
      if (any) out_ += ", ";
      out_ += "**";
      Node(v->kwargs);
    }
    out_ += ")";
  }

  size_t max_depth_;
  size_t max_chars_;
  const RenderOverride& override_;
  bool truncated_ = false;
  std::vector<const Value*> active_;
  std::string out_;
};

}  // namespace

std::string Render(const Value* v, size_t max_depth, size_t max_chars, const RenderOverride& override) {
  Renderer r(std::min(max_depth, kMaxRenderDepth), max_chars, override);
  r.Node(v);
  return r.Take();
}

}  // namespace zckpt::pickle
