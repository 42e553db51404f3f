// A restricted pickle interpreter: reads protocols 0-5 into a tree of Values and runs nothing.
//
// REDUCE/NEWOBJ/NEWOBJ_EX/INST/OBJ become Object nodes (callable + args) instead of calls;
// GLOBAL/STACK_GLOBAL/INST names are judged (safety.h: the allowlist, or only the deny list) as
// they are read. Parsing never recurses in C++, every length is checked against the bytes left,
// and the limits below bound memory and the depth of the finished tree. Errors are zckpt::Error:
//   kCorrupt     "pickle byte offset N: <what>" (N: the offending opcode)
//   kUnsafe      "refused global 'os.system' at pickle byte offset N" (the deny list), or the
//                same followed by ": not on zckpt's allowlist of data globals; ..."
//   kUnsupported "pickle byte offset N: ..." (out-of-band buffers, protocol > 5)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pickle/safety.h"
#include "pickle/value.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

struct UnpickleOptions {
  // Containers inside containers (any path from the root through items, dict keys and values,
  // object parts; the back edge of a cycle ends a path), and open MARKs. Checked as the tree is
  // built and again on the finished tree, since a memo reference lets a pickle grow a container
  // after it was put inside another; every tree walk above this layer may rely on it.
  size_t max_depth = 1000;
  size_t max_memo_entries = size_t{1} << 22;  // distinct memo keys
  size_t max_nodes = size_t{1} << 24;         // Values created (all kinds)
  uint64_t max_total_bytes = uint64_t{1} << 32;  // str/bytes payload held by the tree
  // Besides these, a pickle may hold at most about twice its own size in str/bytes payload and
  // in container members (legitimate pickles stay far below; memo references multiplied
  // through set(list) or encode(text) do not), and a decimal INT/LONG literal at most
  // kMaxDecimalDigits digits (bigint.h: Python's own int_max_str_digits).
  //
  // Which globals the pickle may name (safety.h). The default is the allowlist: a pickle read
  // for anything that may be handed on. kDenyListOnly is for readers that only describe it.
  GlobalPolicy globals = GlobalPolicy::kAllowList;
  std::vector<std::string> allow_globals;  // "module.name" the caller trusts besides the allowlist
};

// A GLOBAL/STACK_GLOBAL/INST name the pickle uses, with the offset of its first use.
struct GlobalRef {
  std::string module;
  std::string name;
  uint64_t offset = 0;
};

struct UnpickleResult {
  std::shared_ptr<ValueArena> arena;  // owns every node, `root` included
  const Value* root = nullptr;
  uint64_t end_offset = 0;            // the byte after STOP
  std::vector<GlobalRef> globals;     // distinct (module, name), in order of first use
  size_t max_depth = 1000;            // the limit it was read under: no path from `root` is longer
};

// Reads one pickle from the start of `bytes`; bytes after its STOP are left alone (legacy
// torch files hold several pickles back to back).
UnpickleResult Unpickle(std::span<const uint8_t> bytes, const UnpickleOptions& options = {});

}  // namespace zckpt::pickle
