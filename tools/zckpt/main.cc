// `zckpt`: one binary, one subcommand per job.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "zckpt/format.h"

namespace {

struct Command {
  const char* name;
  int (*run)(const zckpt::cli::Argv&);
  const char* summary;
};

const Command kCommands[] = {
    {"convert", zckpt::cli::RunConvert, "rewrite .pt / .safetensors files, or a checkpoint or DCP folder, as .zckpt containers"},
    {"verify", zckpt::cli::RunVerify, "check every checksum and structural rule of containers (and DCP folders)"},
    {"ls", zckpt::cli::RunLs, "list a container's tensors, storages, chunks and metadata"},
    {"export", zckpt::cli::RunExport, "write a container back as a .pt (or .safetensors) file, a DCP folder as .distcp"},
    {"merge", zckpt::cli::RunMerge, "reassemble full tensors of a sharded checkpoint into a container or a HF folder"},
    {"reshard", zckpt::cli::RunReshard, "rewrite verl per-rank files for another world size (runs python -m zckpt)"},
    {"load", zckpt::cli::RunLoad, "stream a container into memory on a device and report speed and memory"},
    {"bench", zckpt::cli::RunBench, "benchmark verify/load against baselines measured in the same run"},
};

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: zckpt COMMAND [ARGS...]\n\n"
               "zckpt: zero-copy checkpoints for PyTorch.\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-8s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\n'zckpt help COMMAND' (or 'zckpt COMMAND --help') describes one command.\n"
               "Exit codes: 0 success; 1 a file is corrupt or refused as unsafe; 2 could not run\n"
               "(bad usage, missing file, not a container, a format zckpt does not convert, an\n"
               "existing destination without --force, I/O error).\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return zckpt::cli::kExitCannotRun;
  }
  std::string name = argv[1];
  if (name == "--help" || name == "-h" || (name == "help" && argc == 2)) {
    PrintUsage(stdout);
    return zckpt::cli::kExitOk;
  }
  zckpt::cli::Argv args(argv + 2, argv + argc);
  if (name == "help") {  // `zckpt help CMD` is `zckpt CMD --help`
    if (argc > 3) {
      std::fprintf(stderr, "zckpt help: give one COMMAND\n");
      return zckpt::cli::kExitCannotRun;
    }
    name = argv[2];
    args = {"--help"};
  }
  if (name == "--version") {
    std::printf("zckpt %s (container format %u.%u)\n", ZCKPT_VERSION, unsigned{zckpt::format::kMajorVersion},
                unsigned{zckpt::format::kMinorVersion});
    return zckpt::cli::kExitOk;
  }
  for (const Command& c : kCommands) {
    if (name == c.name) return zckpt::cli::RunGuarded(c.name, c.run, args);
  }
  std::fprintf(stderr, "zckpt: unknown command '%s'\n\n", name.c_str());
  PrintUsage(stderr);
  return zckpt::cli::kExitCannotRun;
}
