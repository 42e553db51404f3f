// The error boundary both binaries (`zckpt`, `zckpt-load`) put around a subcommand.
#include <cstdio>
#include <exception>

#include "cli.h"
#include "commands.h"

namespace zckpt::cli {

int RunGuarded(const char* name, int (*run)(const Argv&), const Argv& args) {
  try {
    return run(args);
  } catch (const Error& e) {
    std::fprintf(stderr, "zckpt %s: %s\n", name, e.what());
    return ExitCodeFor(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zckpt %s: internal error: %s\n", name, e.what());
    return kExitCannotRun;
  }
}

}  // namespace zckpt::cli
