// `zckpt-load`: the torch-linked half of the `zckpt` tool. `zckpt load ARGS` execs
// `zckpt-load ARGS`; running it directly is the same command.
#include "commands.h"

int main(int argc, char** argv) {
  return zckpt::cli::RunGuarded("load", zckpt::cli::RunLoad, zckpt::cli::Argv(argv + 1, argv + argc));
}
