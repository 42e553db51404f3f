// The object pickle a container keeps (blob `data.pkl`), read by zckpt's own interpreter before
// anything else sees it, and held against the container's index.
//
// Two descriptions of the same tensors live in a container: the index (storages, tensor views:
// what Load/LoadInto/Map and the C++ object tree give) and the pickle (what zckpt.load and an
// exported .pt give through torch's unpickler). `zckpt convert` writes the index from the pickle,
// so they agree; a forged container can make them disagree, and then two loaders would return
// different data for one file. Every reader that trusts one side checks the other agrees first:
//   storages  the same keys, each with the same dtype, untyped flag, location and byte size;
//   tensors   the same names, each viewing the same storage key with the same dtype, shape,
//             stride, storage offset, flags and extra record (as convert writes them).
// This is a check above the format layer: src/format knows nothing of pickles.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pickle/safety.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "zckpt/container.h"

namespace zckpt::checkpoint {

// How a pickle is read: the allowlist plus the caller's names (anything that hands the pickle
// on, or gives back what it describes), or the deny list only (ls, verify).
struct PickleReadOptions {
  pickle::GlobalPolicy globals = pickle::GlobalPolicy::kAllowList;
  std::vector<std::string> allow_globals;  // "module.name"
  pickle::UnpickleOptions Unpickle() const;
};

struct ObjectPickle {
  // The blob, read once into memory of its own and checked against its XXH3: what is vetted,
  // interpreted and exported is this copy, whatever the file holds by now.
  std::vector<uint8_t> bytes;
  pickle::UnpickleResult tree;
  pickle::TorchPickle model;
};

// The container's object pickle, read and checked against the index; nullopt when it keeps
// none. Throws Error, every message starting with the file's path:
//   kUnsafe   a global the read refuses ("FILE: object pickle: refused global 'x.y' at pickle
//             byte offset N...")
//   kCorrupt  the blob fails its checksum, the pickle is malformed, or it disagrees with the
//             index ("FILE: the object pickle and the index disagree: tensor 'w': ...", the
//             first disagreement and how many there are)
std::optional<ObjectPickle> ReadObjectPickle(const Container& c, const PickleReadOptions& options = {});

// One disagreement between the object pickle and the index, about a storage or a tensor.
struct Disagreement {
  std::string storage;  // the storage key concerned, "" when about a tensor
  std::string tensor;   // the tensor concerned, "" when about a storage
  std::string message;  // "tensor 'w': storage offset 3 in the pickle, 0 in the index"
};

// Every disagreement between `model` (read from `c`'s object pickle) and `c`'s index; empty when
// they agree.
std::vector<Disagreement> IndexDisagreements(const Container& c, const pickle::TorchPickle& model);

// For verify (reads under the deny list only): what is wrong with the object pickle, one problem
// each, its message naming the file, its place the file (and the storage or tensor an index
// disagreement is about): kUnsafe refused, kCorrupt malformed, damaged or disagreeing with the
// index. Empty when it is sound or there is none. An Error that is not a finding (IsFinding: an
// unsupported dtype) is thrown: the file cannot be checked.
std::vector<VerifyProblem> ObjectPickleProblems(const Container& c);

// The index's tensor flags (format::kTensor*) for a tensor the pickle describes, as convert
// writes them.
uint32_t IndexFlags(const pickle::TorchTensor& t);

}  // namespace zckpt::checkpoint
