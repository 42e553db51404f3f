// fuzz_convert: `zckpt convert` end to end on arbitrary bytes (ConvertFile, then ExportFile):
// torch.save files (zip, legacy) and safetensors files.
//
// The input is written to a file (under /dev/shm when there is one) and converted. What must
// hold: a refused input throws Error of a kind that says the source is at fault (corrupt, not a
// .pt, unsupported, unsafe: never invalid-argument or io, which would mean the converter handed
// the writer something the readers let through) and leaves no file behind; an accepted input
// gives a container that verifies, and that exports back (the legacy format and safetensors byte
// for byte, a zip archive record for record).
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "fuzz_target.h"
#include "pt/pt_archive.h"
#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt::fuzz {

namespace {

const std::string& WorkDir() {
  static const std::string dir = [] {
    std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    std::string tmpl = base + "/zckpt-fuzz-convert-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) std::abort();
    std::string d = buf.data();
    // Removed at exit (libFuzzer exits through exit(), the regression suite returns from main).
    static std::string to_remove = d;
    std::atexit([] {
      for (const char* f : {"/in.pt", "/out.zckpt", "/back.pt"}) unlink((to_remove + f).c_str());
      rmdir(to_remove.c_str());
    });
    return d;
  }();
  return dir;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    closedir(d);
  }
  return out;
}

bool WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  MappedFile m(path);
  return std::vector<uint8_t>(m.data(), m.data() + m.size());
}

}  // namespace

void FuzzConvert(const uint8_t* data, size_t size) {
  const std::string& dir = WorkDir();
  const std::string in = dir + "/in.pt", out = dir + "/out.zckpt", back = dir + "/back.pt";
  unlink(out.c_str());
  unlink(back.c_str());
  if (!WriteFile(in, data, size)) std::abort();

  ConvertOptions o;
  o.writer.threads = 1;
  o.writer.chunk_bytes = 4096;
  o.writer.zstd_level = size % 3 == 0 ? 1 : 0;  // both codecs, decided by the input
  try {
    ConvertFile(in, out, o);
  } catch (const Error& e) {
    if (!(e.kind() == ErrorKind::kCorrupt || e.kind() == ErrorKind::kNotContainer ||
          e.kind() == ErrorKind::kUnsupported || e.kind() == ErrorKind::kUnsafe)) {
      std::fprintf(stderr, "ConvertFile refused the input with %s: %s\n", ErrorKindName(e.kind()), e.what());
      ZCKPT_FUZZ_CHECK(!"refused with a kind that blames the caller or the disk");
    }
    ZCKPT_FUZZ_CHECK(Entries(dir) == std::vector<std::string>{"in.pt"});  // nothing left behind
    return;
  }

  // Accepted: the container verifies.
  {
    auto c = Container::Open(out);
    VerifyOptions vo;
    vo.threads = 1;
    ZCKPT_FUZZ_CHECK(c->Verify(vo).ok());
  }
  // ... and goes back to what it came from: a safetensors source byte for byte, as a .safetensors.
  bool safetensors = false;
  {
    auto c = Container::Open(out);
    auto fmt = c->FindMetadata("zckpt.source.format");
    safetensors = fmt && *fmt == "safetensors";
  }
  try {
    ExportFile(out, back, safetensors ? ExportFormat::kSafetensors : ExportFormat::kTorch);
  } catch (const Error& e) {
    std::fprintf(stderr, "ExportFile of an accepted input failed (%s): %s\n", ErrorKindName(e.kind()), e.what());
    ZCKPT_FUZZ_CHECK(!"export of a converted file failed");
  }
  std::vector<uint8_t> input(data, data + size), exported = ReadFile(back);
  if (safetensors) {
    ZCKPT_FUZZ_CHECK(exported == input);
  } else if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
    pt::TorchArchive a(std::make_shared<const MappedFile>(data, size, "in.pt"));
    pt::TorchArchive b(std::make_shared<const MappedFile>(exported.data(), exported.size(), "back.pt"));
    ZCKPT_FUZZ_CHECK(a.RecordNames() == b.RecordNames());
    for (const pt::TorchRecord& r : a.records()) {
      std::span<const uint8_t> x = a.Record(r.name), y = b.Record(r.name);
      ZCKPT_FUZZ_CHECK(x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin()));
    }
  } else {
    ZCKPT_FUZZ_CHECK(exported == input);  // legacy: byte for byte
  }
}

}  // namespace zckpt::fuzz

ZCKPT_FUZZ_ENTRY(zckpt::fuzz::FuzzConvert)
