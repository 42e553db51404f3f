// The allowlist: globals a pickle may name because they are known to be data. Resolving and
// calling one with any arguments builds a value (a tensor from a storage, a dtype, a dict, a
// numpy array, a DTensor's placement) and runs nothing else. Built from what the project's
// torch-family fixtures (tests/fixtures/torch_family.py) contain and torch's own weights-only
// allowlist (torch/_weights_only_unpickler.py, _get_allowed_globals and the safe globals that
// torch.distributed registers). Anything else needs the caller's explicit permission
// (safety.h: GlobalVetter); the deny list still refuses what would run code.
#pragma once

#include <string_view>

namespace zckpt::pickle {

// True when the global at `path` ("module.name", as CanonicalGlobalPath spells it) is data.
bool IsDataGlobal(std::string_view path);

}  // namespace zckpt::pickle
