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
// Longest shape-like list read (torch has no tensors of more dimensions; the cap keeps a
// memo-shared huge tuple from costing its size at every use).
constexpr size_t kMaxListInts = 1024;
// Entries a keyed lookup scans (same reason: a shared huge dict must not cost its size at every
// tensor). Real attribute dicts have a few dozen.
constexpr size_t kMaxLookupEntries = 256;
// Bool, or an int 0/1 (old pickles).
std::optional<bool> AsBool(const Value* v);
// str, or latin-1 bytes (Python 2 pickles).
std::optional<std::string> AsText(const Value* v);
// AsText for metadata strings (keys, locations, dtype codes, placements): nullopt beyond
// kMaxShortText bytes, so a memo-shared huge string is never copied once per use.
constexpr size_t kMaxShortText = 4096;
std::optional<std::string> AsShortText(const Value* v);
// A tuple/list of at most kMaxListInts ints, or torch.Size((...)).
std::optional<std::vector<int64_t>> AsIntList(const Value* v);
// torch.device('cuda', 0) -> "cuda:0"; a device string as is.
std::optional<std::string> AsDevice(const Value* v);

// The class or function name of a global, without its module ("DTensor"); "" otherwise.
std::string_view GlobalName(const Value* v);
// True for a global whose module is torch or below it.
bool IsTorchGlobal(const Value* v);
// GlobalPath, or "<long name>" beyond kMaxShortText bytes.
std::string ShortGlobalPath(const Value* v);

// The dicts an object's BUILD state (`obj->state`) holds its attributes in: the state itself
// when a dict, the non-None dicts of a (dict or None, slots dict) tuple; none otherwise.
std::vector<const Value*> StateDicts(const Value* state);
// One attribute of the state (string key), nullptr when absent; scans kMaxLookupEntries per dict.
const Value* StateAttribute(const Value* state, std::string_view name);
// DictGet over the first kMaxLookupEntries entries.
const Value* SmallDictGet(const Value* dict, std::string_view key);

}  // namespace zckpt::pickle
