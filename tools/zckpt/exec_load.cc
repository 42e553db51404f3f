// `zckpt load` in the torch-free `zckpt`: hands the process to `zckpt-load`, installed beside it.
//
// Why two binaries: LibTorch's start-up (loading and relocating ~1 GB of shared libraries) costs
// ~0.5 s of CPU per run, more than a whole `zckpt verify` of a 1 GiB shard; only `load` needs it.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"

namespace zckpt::cli {

namespace {

// The folder of the running executable ("" when /proc is unavailable).
std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string self(buf, static_cast<size_t>(n));
  auto slash = self.rfind('/');
  return slash == std::string::npos ? "" : self.substr(0, slash);
}

}  // namespace

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
