// torch.distributed.checkpoint folders in `zckpt convert` and `zckpt export`: a folder holding
// `.metadata` and its shards is one checkpoint, converted and exported as a whole
// (include/zckpt/dcp.h); `zckpt verify` checks it in cmd_verify.cc.
#include <cstdio>

#include "cli.h"
#include "commands.h"
#include "progress.h"
#include "zckpt/dcp.h"
#include "zckpt/merge.h"

namespace zckpt::cli {

int ConvertDcp(const std::string& source, const std::string& destination, const ConvertOptions& base, bool quiet,
               ProgressStyle progress) {
  try {
    ConvertOptions options = base;
    ProgressBar bar("convert " + source, 0, progress);
    options.progress = [&bar](uint64_t done, uint64_t total) {
      bar.SetTotal(total);
      bar.Set(done);
    };
    DcpConvertStats s = ConvertDcpFolder(source, destination, options);
    bar.Finish();
    if (!quiet)
      std::printf("%s -> %s: DCP checkpoint, %llu .distcp files -> containers (%llu tensor pieces, %llu other items), "
                  "%llu files copied, %s -> %s\n",
                  source.c_str(), destination.c_str(), static_cast<unsigned long long>(s.files),
                  static_cast<unsigned long long>(s.tensors), static_cast<unsigned long long>(s.bytes_items),
                  static_cast<unsigned long long>(s.copied), FormatBytes(s.source_bytes).c_str(),
                  FormatBytes(s.written_bytes).c_str());
    return kExitOk;
  } catch (const Error& e) {
    std::fprintf(stderr, "zckpt convert: %s\n", e.what());
    return ExitCodeFor(e);
  }
}

int ExportDcp(const std::string& source, const std::string& destination, bool force,
              const std::vector<std::string>& allow_globals) {
  if (!force) {
    std::vector<std::string> existing;
    for (const std::string& out : DcpExportOutputs(source, destination))
      if (Exists(out)) existing.push_back(out);
    if (!existing.empty()) return RefuseExisting("export", existing);
  }
  // Byte for byte is no excuse to hand on a checkpoint whose pieces do not make its tensors.
  CheckDcpTiling(source);
  ExportDcpFolder(source, destination, allow_globals);
  return kExitOk;
}

}  // namespace zckpt::cli
