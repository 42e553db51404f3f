// The deny list: globals a pickle may name that would run code (or reach files, processes,
// the network or the import system) if a real unpickler resolved and called them.
//
// This interpreter calls nothing, so the list protects whoever loads the same bytes with
// Python later (a checkpoint we accept should be one `torch.load` can open without running
// foreign code), and keeps our own interpretation honest. A refusal is the safe default: when
// in doubt an entry is on the list. The table itself is in safety.cc.
#pragma once

#include <optional>
#include <string_view>

namespace zckpt::pickle {

// True when the global `module`.`name` (as written in a GLOBAL/STACK_GLOBAL/INST opcode) is
// refused. `name` may be dotted (protocol 4 qualified names); Python 2 spellings
// (`__builtin__`, `commands`, ...) are judged as what Python 3 maps them to.
bool IsCodeExecutionGlobal(std::string_view module, std::string_view name);

// Why it is refused (the table's comment for the matching entry), nullopt when allowed.
std::optional<std::string_view> RefusalReason(std::string_view module, std::string_view name);

}  // namespace zckpt::pickle
