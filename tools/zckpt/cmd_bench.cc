// `zckpt bench`: placeholder until its layer lands.
#include "cli.h"
#include "commands.h"

namespace zckpt::cli {

int RunBench(const Argv&) { return UsageError("bench", "not available in this build yet"); }

}  // namespace zckpt::cli
