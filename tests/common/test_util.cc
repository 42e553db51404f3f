#include "test_util.h"

#include <dirent.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace zckpt::testing {

// POSIX calls, not std::filesystem: torch 2.11's libtorch exports its own copy of
// std::filesystem, which the loader suites' calls bind to (libtorch comes before libstdc++ in
// their lookup order) and which crashes in remove_all.
namespace {
std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  (void)::remove(path);
  return 0;
}
}  // namespace

TempDir::TempDir() {
  std::string base = EnvOr("TMPDIR", "/tmp") + "/zckpt-test-XXXXXX";
  std::vector<char> buf(base.begin(), base.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  // Depth first, not following symlinks; keeps going past entries it cannot remove.
  (void)nftw(path_.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* d = opendir(path.c_str())) {
    while (const dirent* e = readdir(d))
      if (std::string name = e->d_name; name != "." && name != "..") names.push_back(name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string TestPython() { return EnvOr("ZCKPT_TEST_PYTHON", ""); }
std::string SourceRoot() { return EnvOr("ZCKPT_SOURCE_ROOT", "."); }
std::string BuildRoot() { return EnvOr("ZCKPT_BUILD_ROOT", "."); }

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

int RunCommand(const std::string& command, std::string* output) {
  std::string cmd = command + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  std::string text;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  int status = pclose(pipe);
  if (output) *output = text;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool PythonHasTorch() {
  static const bool has = [] {
    if (TestPython().empty()) return false;
    return RunCommand(ShellQuote(TestPython()) + " -c 'import torch'") == 0;
  }();
  return has;
}

int RunPython(const std::string& script, const std::vector<std::string>& args, std::string* output) {
  std::string cmd = ShellQuote(TestPython()) + " " + ShellQuote(SourceRoot() + "/" + script);
  for (const auto& a : args) cmd += " " + ShellQuote(a);
  return RunCommand(cmd, output);
}

bool EvictFromPageCache(const std::string& path, uint64_t offset, uint64_t len) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(len), POSIX_FADV_DONTNEED);
  ::close(fd);
  int direct = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (direct < 0) return false;
  void* buf = nullptr;
  bool works = posix_memalign(&buf, 4096, 4096) == 0 && pread(direct, buf, 4096, 0) >= 0;
  std::free(buf);
  ::close(direct);
  return works;
}

}  // namespace zckpt::testing
