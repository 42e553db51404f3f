// `zckpt load`: placeholder until its layer lands.
#include "cli.h"
#include "commands.h"

namespace zckpt::cli {

int RunLoad(const Argv&) { return UsageError("load", "not available in this build yet"); }

}  // namespace zckpt::cli
