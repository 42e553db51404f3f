// The subcommands of `zckpt`, each in its own cmd_*.cc. Each takes the arguments after its
// name and returns an exit code (cli.h).
#pragma once

#include <string>
#include <vector>

namespace zckpt::cli {

using Argv = std::vector<std::string>;

int RunVerify(const Argv& args);
int RunLs(const Argv& args);
int RunConvert(const Argv& args);
int RunExport(const Argv& args);
int RunLoad(const Argv& args);
int RunBench(const Argv& args);

}  // namespace zckpt::cli
