// `zckpt load` in the torch-free `zckpt`: hands the process to `zckpt-load`, installed beside it.
//
// Why two binaries: LibTorch's start-up (loading and relocating ~1 GB of shared libraries) costs
// ~0.5 s of CPU per run, more than a whole `zckpt verify` of a 1 GiB shard; only `load` needs it.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"

namespace zckpt::cli {

int ExecLoad(const Argv& args) {
  std::string dir = SelfDir();
  std::string helper = (dir.empty() ? std::string(".") : dir) + "/zckpt-load";
  if (access(helper.c_str(), X_OK) != 0)
    return UsageError("load", "not available: " + helper +
                                  " is missing (zckpt was built without torch; rebuild with -Dpython=<a Python with torch>)");
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(helper.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(helper.c_str(), argv.data());
  return UsageError("load", "cannot run " + helper + ": " + std::strerror(errno));
}

}  // namespace zckpt::cli
