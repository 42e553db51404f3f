// `zckpt convert`: placeholder until its layer lands.
#include "cli.h"
#include "commands.h"

namespace zckpt::cli {

int RunConvert(const Argv&) { return UsageError("convert", "not available in this build yet"); }

}  // namespace zckpt::cli
