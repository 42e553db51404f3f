// The calls of zckpt's torch-free core, by name, on JSON values: what the Python package reaches
// through the C ABI of libzckpt_core.so (core_abi.cc, zckpt/_core.py) and what the tests' `_C`
// binds too (core_functions.cc), one implementation for both. A call takes its arguments as one
// JSON object, every argument given (zckpt/_core.py supplies the defaults), and returns a JSON
// value; errors are zckpt::Error, thrown.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "zckpt/error.h"
#include "zckpt/save_options.h"

namespace zckpt {
class Container;
}

namespace zckpt::python {

// Insertion-ordered, as the Python dicts it becomes: metadata and records keep the file's order.
using Json = nlohmann::ordered_json;

// What a call gives back besides its JSON value: byte strings (a pickle, a blob: not text), each
// named in the value as {"$bytes": i}.
class Reply {
 public:
  Json Bytes(std::string bytes);
  const std::vector<std::string>& bytes() const { return bytes_; }

 private:
  std::vector<std::string> bytes_;
};

// Bytes the caller passes by address, alive for the call: {"$address": a, "$bytes": n}, or the
// two numbers apart. Error(kInvalidArgument) for a null address of bytes.
std::string_view ArgBytes(const Json& v);
std::string_view AddressBytes(uint64_t address, uint64_t n);
// An argument that may be null.
template <class T>
std::optional<T> Optional(const Json& args, const char* name) {
  const Json& v = args.at(name);
  if (v.is_null()) return std::nullopt;
  return v.get<T>();
}

// Objects the core keeps for its caller (an open checkpoint, a host buffer, a writer, a mapped
// storage's keeper), named by a number: the handles of include/zckpt/zckpt.h, which JSON calls
// take as {"$handle": id}. Each is kept until released as its own kind. Thread-safe.
class Handles {
 public:
  template <class T>
  uint64_t Keep(std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t id = ++last_;
    using Plain = std::remove_const_t<T>;
    held_[id] = Held{std::const_pointer_cast<Plain>(std::move(object)), &typeid(Plain)};
    return id;
  }
  // The object handle `id` names, kept alive by the pointer returned even if released meanwhile;
  // Error(kInvalidArgument) naming `what` for an unknown or released handle or one of another
  // kind of object.
  template <class T>
  std::shared_ptr<T> Get(uint64_t id, const char* what) {
    return std::static_pointer_cast<T>(Find(id, typeid(std::remove_const_t<T>), what, false));
  }
  template <class T>
  std::shared_ptr<T> Get(const Json& handle, const char* what) {
    return Get<T>(handle.at("$handle").get<uint64_t>(), what);
  }
  // Lets go of handle `id`, under the same checks as Get: releasing twice is an error, not a no-op.
  template <class T>
  void Release(uint64_t id, const char* what) {
    Find(id, typeid(std::remove_const_t<T>), what, true);
  }

 private:
  struct Held {
    std::shared_ptr<void> object;
    const std::type_info* type;
  };
  std::shared_ptr<void> Find(uint64_t id, const std::type_info& type, const char* what, bool erase);

  std::mutex mu_;
  uint64_t last_ = 0;
  std::unordered_map<uint64_t, Held> held_;
};
Handles& TheHandles();

// Where an error lies (ErrorPlace) as JSON: {"file", "storage", "tensors" (a list), "chunk",
// "file_bytes", "storage_bytes" ([begin, end])}, null for what it is not about: the attributes
// of the Python error classes and the fields of zckpt.verify's problems.
Json PlaceJson(const ErrorPlace& place);
// A finding of a check (VerifyProblem, whose kind IsFinding) as JSON: PlaceJson with "kind"
// (ErrorKindName: "corrupt" or "unsafe") and "message", one entry of zckpt.verify's and
// verify_chunks' lists.
Json ProblemJson(ErrorKind kind, const std::string& message, const ErrorPlace& place);

// Container::Open, its "not a container" error hinting at `zckpt convert` when the file is a
// .pt or safetensors file (zckpt.load("x.pt")).
std::unique_ptr<Container> OpenContainer(const std::string& path);
// What each kind of handle is called in errors ("handle 7 is not an open checkpoint").
inline constexpr const char* kCheckpointHandle = "an open checkpoint";
inline constexpr const char* kHostBufferHandle = "a host buffer";
inline constexpr const char* kMappedHandle = "a mapped storage";
inline constexpr const char* kWriterHandle = "an open writer";
// The open checkpoint args["checkpoint"] names (a handle zckpt_open made).
std::shared_ptr<Container> HeldContainer(const Json& args);
// Each call that reads a container can take one the caller opened: zckpt/_api.py opens a
// checkpoint once and asks that one open file for its metadata, its vetted pickle and its
// storages, so a file renamed over the path in between cannot mix two checkpoints
// (include/zckpt/loader.h).
// {"storages": [{key, location, dtype, bytes}], "tensors": [names], "metadata": {}, "bytes"}.
Json Describe(const Container& c);
// Every tensor record: what the converter learned of each tensor (shape, flags, and the JSON
// `extra` carrying a ShardedTensor shard's offsets/sizes/placement or a DTensor's placements and
// mesh), read from the index alone.
Json TensorRecords(const Container& c);
// The object pickle, read by zckpt's interpreter under the allowlist plus `allow_globals` and
// checked against the index, before Python hands it to torch's unpickler: the bytes returned are
// the ones vetted. Errors as ReadObjectPickle (kUnsafe, kCorrupt naming the file).
std::string VettedPickle(const Container& c, const std::vector<std::string>& allow_globals);

// What zckpt.save returns: `path` as "destination" and SaveStats' figures.
Json SaveStatsJson(const std::string& path, const SaveStats& s);

// Runs call `name`. Throws Error(kInvalidArgument) for a name no call has.
Json RunCall(const std::string& name, const Json& args, Reply& reply);

// The calls of each file, added to the table RunCall reads.
using Call = Json (*)(const Json& args, Reply& reply);
using CallTable = std::unordered_map<std::string, Call>;
void AddContainerCalls(CallTable& calls);  // core_calls.cc: open, describe, convert, verify, files, objects, format constants, load_into's checks
void AddLoadCalls(CallTable& calls);       // core_load_calls.cc: buffers, loads, mappings, saves, copies
void AddShardedCalls(CallTable& calls);    // core_sharded.cc: the container writer, DCP, merge

}  // namespace zckpt::python
