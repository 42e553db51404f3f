// Readers for the small values torch pickles around tensors: ints, shapes (tuples or
// torch.Size), flags, devices, and object state dicts. nullopt/nullptr when the value is not
// of that shape; the caller decides whether that is an error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pickle/value.h"

namespace zckpt::pickle {

std::optional<int64_t> AsInt(const Value* v);
// Int or float as a double (quantizer scales).
std::optional<double> AsNumber(const Value* v);
// Bool, or an int 0/1 (old pickles).
std::optional<bool> AsBool(const Value* v);
// str, or latin-1 bytes (Python 2 pickles).
std::optional<std::string> AsText(const Value* v);
// A tuple/list of ints, or torch.Size((...)).
std::optional<std::vector<int64_t>> AsIntList(const Value* v);
// torch.device('cuda', 0) -> "cuda:0"; a device string as is.
std::optional<std::string> AsDevice(const Value* v);

// The class or function name of a global, without its module ("DTensor"); "" otherwise.
std::string_view GlobalName(const Value* v);
// True for a global whose module is torch or below it.
bool IsTorchGlobal(const Value* v);

// The attributes in an object's BUILD state (`obj->state`): a dict, or a (dict or None, slots
// dict) tuple. Pairs are (attribute, value) for string keys, in order.
std::vector<std::pair<std::string, const Value*>> StateAttributes(const Value* state);
// One attribute of StateAttributes, nullptr when absent.
const Value* StateAttribute(const Value* state, std::string_view name);

}  // namespace zckpt::pickle
