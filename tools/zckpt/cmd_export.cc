// `zckpt export SRC.zckpt -o DST.pt` / `-o DST.safetensors`, and `zckpt export DCP_DIR -o OUTDIR`.
#include <cstdio>
#include <filesystem>

#include "cli.h"
#include "commands.h"
#include "zckpt/convert.h"
#include "zckpt/dcp.h"
#include "zckpt/object_store.h"

namespace zckpt::cli {

namespace {
constexpr const char* kHelp =
    "usage: zckpt export SRC.zckpt -o DST [--format pt|safetensors] [--force] [--allow-global MOD.NAME]...\n"
    "       zckpt export DCP_DIR -o OUTDIR [--force] [--allow-global MOD.NAME]...\n\n"
    "Writes the container back as the file it came from. --format pt (the default, unless DST\n"
    "ends in .safetensors): a torch.save file: the kept object pickle and every record of the\n"
    "source archive (legacy-format sources come back byte for byte; a safetensors source becomes\n"
    "the torch.save file of the dict safetensors.torch.load_file returns). --format safetensors:\n"
    "a container converted from a safetensors file comes back byte for byte; one from a torch.save\n"
    "file of a flat dict of tensors comes back exactly as safetensors.torch.save_file writes that\n"
    "dict; anything else (nested state, DTensors, tensors sharing memory, ...) is refused, naming\n"
    "what safetensors cannot hold. Before a byte is written, the object pickle (and every pickle\n"
    "of a legacy header) is vetted by zckpt's interpreter (its globals on the allowlist or allowed\n"
    "below) and held against the container's index, and the record names are checked (nothing\n"
    "that unpacks outside its folder, no TorchScript marker, nothing torch.load needs missing).\n"
    "Every chunk is checked on the way; nothing appears at DST unless the export completes.\n"
    "Even with --force only a regular file is replaced: a FIFO, device node, directory or\n"
    "symbolic link at DST is refused and left alone (exit 2).\n\n"
    "A torch.distributed.checkpoint folder converted by 'zckpt convert DIR' goes back to DCP's\n"
    "FileSystemWriter layout: each .distcp file byte for byte, .metadata and the other files\n"
    "unchanged (a folder written by zckpt.dcp.ZckptStorageWriter has no .distcp bytes to give\n"
    "back: 'zckpt merge' writes its full model). Its non-tensor items, which DCP's planner\n"
    "unpickles without weights_only, are vetted first as object pickles are.\n"
    "SRC may be in S3-compatible storage (s3://BUCKET/KEY.zckpt, or a converted DCP folder\n"
    "s3://BUCKET/PREFIX/), configured as the AWS CLI is; DST is local.\n\n"
    "options:\n"
    "  -o, --output DST      destination (required)\n"
    "  --format FORMAT       pt or safetensors (default: from DST's extension, else pt)\n"
    "  -f, --force           overwrite DST (a DCP folder: the files it writes there) if it\n"
    "                        exists (default: refuse, exit 2)\n"
    "%s\n"
    "Exit codes:\n"
    "  0  written\n"
    "  1  the container is corrupt, inconsistent or unsafe (a checksum, a record contradicting\n"
    "     another, the pickle and the index disagreeing, a refused global, an unsafe record name)\n"
    "  2  could not run: bad usage, a missing file, not a container, DST exists (without --force),\n"
    "     a container safetensors cannot hold (--format safetensors), a DCP folder not\n"
    "     converted from .distcp files, DST named as another format (y.npz, y.zckpt: a .pt,\n"
    "     .pth, .bin or .ckpt name for pt), an I/O error\n";

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

int RunExport(const Argv& argv) {
  Args args(argv, {"help", "force"}, {"output", "format", "allow-global"}, {{"h", "help"}, {"o", "output"}, {"f", "force"}});
  if (!args.ok()) return UsageError("export", args.error());
  if (args.Has("help")) {
    std::printf(kHelp, kAllowGlobalHelp);
    return kExitOk;
  }
  if (args.positional().size() != 1) return UsageError("export", "expected exactly one SRC.zckpt");
  auto out = args.Get("output");
  if (!out) return UsageError("export", "-o DST is required");
  std::string format = args.Get("format").value_or(EndsWith(*out, ".safetensors") ? "safetensors" : "pt");
  if (format != "pt" && format != "safetensors") return UsageError("export", "--format takes pt or safetensors");
  if (IsObjectUrl(*out))
    return UsageError("export", *out + ": export writes a local file (or folder); export to a local path, then upload it");
  if (SameFile(args.positional()[0], *out))
    return UsageError("export", "the destination is the source file: " + *out);
  if (IsDcpFolder(args.positional()[0])) {
    if (args.Get("format") && *args.Get("format") != "pt")
      return UsageError("export", "a DCP folder goes back to its .distcp files (--format pt); 'zckpt merge " +
                                      args.positional()[0] + " -o OUT' writes its model as safetensors");
    return ExportDcp(args.positional()[0], *out, args.Has("force"), args.GetAll("allow-global"));
  }
  std::error_code ec;
  const std::string& src = args.positional()[0];
  if (IsObjectUrl(src) ? IsObjectFolder(src) : std::filesystem::is_directory(src, ec))
    return UsageError("export", args.positional()[0] + " is a folder: export takes one container (SRC.zckpt) or a DCP " +
                                    "folder converted by 'zckpt convert'; export each container of it, or 'zckpt merge " +
                                    args.positional()[0] + " -o OUT' writes the full model");
  if (std::string why = MisleadingExtension(*out, format == "pt" ? ".pt" : ".safetensors",
                                            format == "pt" ? "a torch.save file" : "a safetensors file");
      !why.empty())
    return UsageError("export", why);
  if (!args.Has("force") && Exists(*out))
    return UsageError("export", *out + " exists; nothing was written (--force overwrites)");
  ExportOptions options;
  options.format = format == "safetensors" ? ExportFormat::kSafetensors : ExportFormat::kTorch;
  options.allow_globals = args.GetAll("allow-global");
  ExportFile(args.positional()[0], *out, options);
  return kExitOk;
}

}  // namespace zckpt::cli
