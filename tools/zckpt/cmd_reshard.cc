// `zckpt reshard`: hands the process to `python -m zckpt reshard` (src/python/zckpt/reshard.py).
//
// Why Python: a resharded verl file must hold what torch.save writes at the new world size:
// DTensors with a DeviceMesh of N ranks, or ShardedTensors with their ShardMetadata, pickled
// as torch pickles them. torch builds those objects; zckpt's C++ side only reads pickles. The
// heavy part, reassembling each full tensor with bounded memory, is the same C++ merge.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"

namespace zckpt::cli {

namespace {

bool HasPackage(const std::string& dir) { return !dir.empty() && access((dir + "/zckpt/__init__.py").c_str(), R_OK) == 0; }

}  // namespace

int RunReshard(const Argv& args) {
#ifdef ZCKPT_PYTHON
  std::string python = ZCKPT_PYTHON;
  std::string site = ZCKPT_PYTHON_SITE;
#else
  std::string python, site;
#endif
  if (const char* p = std::getenv("ZCKPT_PYTHON"); p && *p) python = p;
  if (python.empty() || access(python.c_str(), X_OK) != 0)
    return UsageError("reshard", "needs a Python with torch and the zckpt package: run 'python -m zckpt reshard ...' "
                                 "(or set ZCKPT_PYTHON)");
  // The package of this build (BUILD/src/python beside BUILD/tools), of a wheel (the binary is
  // SITE/zckpt/bin/zckpt), or of the installation.
  std::string build_tree = SelfDir() + "/../src/python", wheel = SelfDir() + "/../..";
  std::string path = HasPackage(build_tree) ? build_tree : HasPackage(wheel) ? wheel : HasPackage(site) ? site : "";
  if (!path.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    std::string value = path + (old && *old ? ":" + std::string(old) : "");
    setenv("PYTHONPATH", value.c_str(), 1);
  }
  std::vector<std::string> argv_s = {python, "-m", "zckpt", "reshard"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(python.c_str(), argv.data());
  return UsageError("reshard", "cannot run " + python + ": " + std::strerror(errno));
}

}  // namespace zckpt::cli
