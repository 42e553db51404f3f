#include "pickle/torch_values.h"

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

std::optional<std::vector<int64_t>> AsIntList(const Value* v) {
  if (const Value* g = ObjectGlobal(v); g && g->text == "torch" && g->name == "Size") {
    const std::vector<Value*>* args = Sequence(v->args);
    if (!args || args->size() != 1) return std::nullopt;
    return AsIntList((*args)[0]);
  }
  const std::vector<Value*>* items = Sequence(v);
  if (!items) return std::nullopt;
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
  if (auto s = AsText(v)) return s;
  const Value* g = ObjectGlobal(v);
  if (!g || g->text != "torch" || g->name != "device") return std::nullopt;
  const std::vector<Value*>* args = Sequence(v->args);
  if (!args || args->empty() || args->size() > 2) return std::nullopt;
  auto type = AsText((*args)[0]);
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

bool IsTorchGlobal(const Value* v) {
  return v && v->kind == Kind::kGlobal && (v->text == "torch" || v->text.rfind("torch.", 0) == 0);
}

namespace {
void AppendAttributes(const Value* dict, std::vector<std::pair<std::string, const Value*>>& out) {
  if (!dict || dict->kind != Kind::kDict) return;
  for (const auto& [k, val] : dict->entries)
    if (k->kind == Kind::kString) out.emplace_back(k->text, val);
}
}  // namespace

std::vector<std::pair<std::string, const Value*>> StateAttributes(const Value* state) {
  std::vector<std::pair<std::string, const Value*>> out;
  if (!state) return out;
  if (state->kind == Kind::kDict) {
    AppendAttributes(state, out);
  } else if (state->kind == Kind::kTuple && state->items.size() == 2) {
    AppendAttributes(state->items[0], out);
    AppendAttributes(state->items[1], out);
  }
  return out;
}

const Value* StateAttribute(const Value* state, std::string_view name) {
  for (const auto& [k, v] : StateAttributes(state))
    if (k == name) return v;
  return nullptr;
}

}  // namespace zckpt::pickle
