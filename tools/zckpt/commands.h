// The subcommands of `zckpt`, each in its own cmd_*.cc. Each takes the arguments after its
// name and returns an exit code (cli.h).
#pragma once

#include <string>
#include <vector>

#include "progress.h"

namespace zckpt {
struct ConvertOptions;
}

namespace zckpt::cli {

using Argv = std::vector<std::string>;

int RunVerify(const Argv& args);
int RunLs(const Argv& args);
int RunConvert(const Argv& args);
int RunExport(const Argv& args);
int RunBench(const Argv& args);
int RunMerge(const Argv& args);
int RunReshard(const Argv& args);
int RunLoad(const Argv& args);

// torch.distributed.checkpoint folders (cmd_dcp.cc), called by convert and export when their
// argument is a DCP folder (src/checkpoint/source_kind.h: IsDcpFolder). Return exit codes.
int ConvertDcp(const std::string& source, const std::string& destination, const zckpt::ConvertOptions& options,
               bool quiet, ProgressStyle progress);
// Refuses (exit 2, nothing written) when a file it would write exists, unless `force`;
// `allow_globals`: --allow-global, for the BytesIO items vetted before anything is written.
int ExportDcp(const std::string& source, const std::string& destination, bool force,
              const std::vector<std::string>& allow_globals);

// Runs one subcommand, turning what it throws into "zckpt NAME: message" and an exit code.
int RunGuarded(const char* name, int (*run)(const Argv&), const Argv& args);

}  // namespace zckpt::cli
