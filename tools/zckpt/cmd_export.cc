// `zckpt export`: placeholder until its layer lands.
#include "cli.h"
#include "commands.h"

namespace zckpt::cli {

int RunExport(const Argv&) { return UsageError("export", "not available in this build yet"); }

}  // namespace zckpt::cli
