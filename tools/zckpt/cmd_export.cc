// `zckpt export SRC.zckpt -o DST.pt`.
#include <cstdio>

#include "cli.h"
#include "commands.h"
#include "zckpt/convert.h"

namespace zckpt::cli {

namespace {
constexpr const char* kHelp =
    "usage: zckpt export SRC.zckpt -o DST.pt\n\n"
    "Writes the container back as a torch.save file: the kept object pickle and every record\n"
    "of the source archive (legacy-format sources come back byte for byte). Every chunk is\n"
    "checked on the way; nothing appears at DST unless the export completes.\n"
    "Exit codes: 0 written; 1 the container is corrupt; 2 could not run.\n";
}

int RunExport(const Argv& argv) {
  Args args(argv, {"help"}, {"output"}, {{"h", "help"}, {"o", "output"}});
  if (!args.ok()) return UsageError("export", args.error());
  if (args.Has("help")) {
    std::fputs(kHelp, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) return UsageError("export", "expected exactly one SRC.zckpt");
  auto out = args.Get("output");
  if (!out) return UsageError("export", "-o DST.pt is required");
  if (SameFile(args.positional()[0], *out))
    return UsageError("export", "the destination is the source file: " + *out);
  ExportFile(args.positional()[0], *out);
  return kExitOk;
}

}  // namespace zckpt::cli
