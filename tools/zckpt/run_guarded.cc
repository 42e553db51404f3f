// The error boundary `zckpt` puts around a subcommand.
#include <cstdio>
#include <exception>

#include "cli.h"
#include "commands.h"
#include "printable.h"

namespace zckpt::cli {

int RunGuarded(const char* name, int (*run)(const Argv&), const Argv& args) {
  try {
    return run(args);
  } catch (const Error& e) {
    // Messages quote names from files: escaped, but several lines on purpose stay several lines.
    std::fprintf(stderr, "zckpt %s: %s\n", name, Printable(e.what(), /*message=*/true).c_str());
    return ExitCodeFor(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zckpt %s: internal error: %s\n", name, Printable(e.what(), true).c_str());
    return kExitCannotRun;
  }
}

}  // namespace zckpt::cli
