#include "pickle/torch_values.h"

#include <algorithm>

#include "pickle/text_codec.h"

namespace zckpt::pickle {

std::optional<int64_t> AsInt(const Value* v) {
  if (v && v->kind == Kind::kInt) return v->integer;
  return std::nullopt;
}

std::optional<double> AsNumber(const Value* v) {
  if (v && v->kind == Kind::kFloat) return v->real;
  if (v && v->kind == Kind::kInt) return static_cast<double>(v->integer);
  return std::nullopt;
}

std::optional<bool> AsBool(const Value* v) {
  if (v && v->kind == Kind::kBool) return v->boolean;
  if (v && v->kind == Kind::kInt && (v->integer == 0 || v->integer == 1)) return v->integer == 1;
  return std::nullopt;
}

std::optional<std::string> AsText(const Value* v) {
  if (v && v->kind == Kind::kString) return v->text;
  if (v && v->kind == Kind::kBytes) return Latin1ToUtf8(v->text);
  return std::nullopt;
}

std::optional<std::string> AsShortText(const Value* v) {
  if (!v || (v->kind != Kind::kString && v->kind != Kind::kBytes) || v->text.size() > kMaxShortText)
    return std::nullopt;
  return AsText(v);
}

std::optional<std::vector<int64_t>> AsIntList(const Value* v) {
  if (const Value* g = ObjectGlobal(v); g && g->text == "torch" && g->name == "Size") {
    // torch.Size((2, 3)): one level only (a torch.Size of a torch.Size, or of itself through
    // the memo, is no shape torch writes, and must not recurse).
    const std::vector<Value*>* args = Sequence(v->args);
    if (!args || args->size() != 1) return std::nullopt;
    v = (*args)[0];
  }
  const std::vector<Value*>* items = Sequence(v);
  if (!items || items->size() > kMaxListInts) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(items->size());
  for (const Value* item : *items) {
    auto i = AsInt(item);
    if (!i) return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

std::optional<std::string> AsDevice(const Value* v) {
  if (auto s = AsShortText(v)) return s;
  const Value* g = ObjectGlobal(v);
  if (!g || g->text != "torch" || g->name != "device") return std::nullopt;
  const std::vector<Value*>* args = Sequence(v->args);
  if (!args || args->empty() || args->size() > 2) return std::nullopt;
  auto type = AsShortText((*args)[0]);
  if (!type) return std::nullopt;
  if (args->size() == 2 && (*args)[1]->kind != Kind::kNone) {
    auto index = AsInt((*args)[1]);
    if (!index) return std::nullopt;
    return *type + ":" + std::to_string(*index);
  }
  return type;
}

std::string_view GlobalName(const Value* v) {
  if (!v || v->kind != Kind::kGlobal) return {};
  return v->name;
}

std::string ShortGlobalPath(const Value* v) {
  if (v && v->kind == Kind::kGlobal && v->text.size() + v->name.size() > kMaxShortText) return "<long name>";
  return GlobalPath(v);
}

bool IsTorchGlobal(const Value* v) {
  return v && v->kind == Kind::kGlobal && (v->text == "torch" || v->text.rfind("torch.", 0) == 0);
}

std::vector<const Value*> StateDicts(const Value* state) {
  std::vector<const Value*> out;
  if (!state) return out;
  if (state->kind == Kind::kDict) {
    out.push_back(state);
  } else if (state->kind == Kind::kTuple && state->items.size() == 2) {
    for (const Value* part : state->items)
      if (part->kind == Kind::kDict) out.push_back(part);
  }
  return out;
}

const Value* SmallDictGet(const Value* dict, std::string_view key) {
  if (!dict || (dict->kind != Kind::kDict && dict->kind != Kind::kObject)) return nullptr;
  size_t n = std::min(dict->entries.size(), kMaxLookupEntries);
  for (size_t i = 0; i < n; ++i) {
    const auto& [k, v] = dict->entries[i];
    if (k->kind == Kind::kString && k->text == key) return v;
  }
  return nullptr;
}

const Value* StateAttribute(const Value* state, std::string_view name) {
  for (const Value* dict : StateDicts(state))
    if (const Value* v = SmallDictGet(dict, name)) return v;
  return nullptr;
}

}  // namespace zckpt::pickle
