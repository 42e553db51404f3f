#include "pickle/data_constructors.h"

#include <algorithm>
#include <cctype>

#include "pickle/text_codec.h"

namespace zckpt::pickle {

namespace {

bool IsBuiltin(const Value* g, std::string_view name) {
  return IsGlobal(g, "builtins", name) || IsGlobal(g, "__builtin__", name);
}

// str.encode(encoding) for the encodings pickles use; nullopt for any other encoding or text
// the encoding cannot represent (Python would raise).
std::optional<std::string> Encode(const std::string& text, std::string encoding) {
  std::transform(encoding.begin(), encoding.end(), encoding.begin(),
                 [](unsigned char c) { return c == '_' ? '-' : static_cast<char>(std::tolower(c)); });
  if (encoding == "latin1" || encoding == "latin-1" || encoding == "iso-8859-1" || encoding == "iso8859-1" ||
      encoding == "l1" || encoding == "latin")
    return Utf8ToLatin1(text);
  if (encoding == "utf-8" || encoding == "utf8") return text;
  if (encoding == "ascii" || encoding == "us-ascii") {
    if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
      return text;
  }
  return std::nullopt;
}

// Arguments of encode(text[, encoding]).
std::optional<std::string> EncodeArgs(const std::vector<Value*>& a) {
  if (a.empty() || a.size() > 2 || a[0]->kind != Kind::kString) return std::nullopt;
  if (a.size() == 1) return a[0]->text;  // the default encoding is utf-8
  if (a[1]->kind != Kind::kString) return std::nullopt;
  return Encode(a[0]->text, a[1]->text);
}

// Arguments of bytes(...) / bytearray(...).
std::optional<std::string> BytesArgs(const std::vector<Value*>& a) {
  if (a.empty()) return std::string();
  if (a.size() == 1 && a[0]->kind == Kind::kBytes) return a[0]->text;
  if (a[0]->kind == Kind::kString) return EncodeArgs(a);
  if (a.size() == 1 && (a[0]->kind == Kind::kList || a[0]->kind == Kind::kTuple)) {
    std::string out;
    for (const Value* v : a[0]->items) {
      if (v->kind != Kind::kInt || v->integer < 0 || v->integer > 255) return std::nullopt;
      out.push_back(static_cast<char>(v->integer));
    }
    return out;
  }
  return std::nullopt;
}

}  // namespace

std::optional<FoldedValue> FoldDataConstructor(const Value* callable, const Value* args) {
  if (!callable || callable->kind != Kind::kGlobal || !args || args->kind != Kind::kTuple) return std::nullopt;
  const std::vector<Value*>& a = args->items;
  FoldedValue out;
  if (IsGlobal(callable, "_codecs", "encode")) {
    auto b = EncodeArgs(a);
    if (!b) return std::nullopt;
    out.bytes = std::move(*b);
    return out;
  }
  if (IsBuiltin(callable, "bytes") || IsBuiltin(callable, "bytearray")) {
    auto b = BytesArgs(a);
    if (!b) return std::nullopt;
    out.bytes = std::move(*b);
    out.bytearray = callable->name == "bytearray";
    return out;
  }
  if (IsBuiltin(callable, "set") || IsBuiltin(callable, "frozenset")) {
    out.kind = callable->name == "set" ? Kind::kSet : Kind::kFrozenSet;
    if (a.empty()) return out;
    Kind k = a.size() == 1 ? a[0]->kind : Kind::kNone;
    if (k != Kind::kList && k != Kind::kTuple && k != Kind::kSet && k != Kind::kFrozenSet) return std::nullopt;
    out.items = a[0]->items;
    return out;
  }
  return std::nullopt;
}

}  // namespace zckpt::pickle
