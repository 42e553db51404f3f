// Which globals a pickle may name.
//
// This interpreter calls nothing, but zckpt hands the pickles it has read on to unpicklers that
// do (zckpt.load replays them through torch's, `zckpt export` writes them for torch.load). So
// every global a pickle names is judged twice:
//   1. the allowlist (allowlist.h): globals known to be data (torch's rebuild functions,
//      storage and dtype objects, collections, numpy's reconstruction, DTensor/ShardedTensor
//      metadata, ...). A global off it is refused unless the caller allows it by name
//      (--allow-global, allow_globals=). Readers that only describe a pickle and never hand it
//      on (ls, verify) may read under kDenyListOnly instead.
//   2. the deny list (this file, second line): globals that would run code, or reach files,
//      processes, the network or the import system, if a real unpickler resolved and called
//      them. Always refused, whatever the caller allows. When in doubt an entry is on the list.
// The tables themselves are in safety.cc and allowlist.cc.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace zckpt::pickle {

enum class GlobalPolicy : unsigned char {
  kAllowList,     // the allowlist plus the caller's names, and never the deny list
  kDenyListOnly,  // anything the deny list does not refuse (readers that hand nothing on)
};

// The judge of one read: the policy and the names ("module.name", as --allow-global takes them)
// the caller allows on top of the allowlist.
class GlobalVetter {
 public:
  GlobalVetter(GlobalPolicy policy, const std::vector<std::string>& allowed);
  // nullopt when the pickle may name `module`.`name`, else why not: the deny list's reason, or
  // that the global is not on the allowlist (and how to allow it).
  std::optional<std::string> Refusal(std::string_view module, std::string_view name) const;

 private:
  GlobalPolicy policy_;
  std::unordered_set<std::string> allowed_;
};

// "module.name" as Python 3's unpickler (and torch.load's) resolves it: Python 2 module names
// mapped (`__builtin__.set` is `builtins.set`), `torch.tensor` read as `torch._tensor`.
std::string CanonicalGlobalPath(std::string_view module, std::string_view name);

// True when the global `module`.`name` (as written in a GLOBAL/STACK_GLOBAL/INST opcode) is
// refused. `name` may be dotted (protocol 4 qualified names); Python 2 spellings
// (`__builtin__`, `commands`, ...) are judged as what Python 3 maps them to.
bool IsCodeExecutionGlobal(std::string_view module, std::string_view name);

// Why it is refused (the table's comment for the matching entry), nullopt when allowed.
std::optional<std::string_view> RefusalReason(std::string_view module, std::string_view name);

}  // namespace zckpt::pickle
