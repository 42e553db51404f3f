// Helpers shared by the GoogleTest suites: temporary folders, file bytes, and running the
// project's Python (whose torch writes the .pt fixtures during the test run).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// ZCKPT_UNDER_ASAN: defined when the code is built with AddressSanitizer (gcc or clang), for
// tests whose resource bounds must allow for it (shadow memory, slower runs).
#if defined(__SANITIZE_ADDRESS__)
#define ZCKPT_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZCKPT_UNDER_ASAN 1
#endif
#endif

namespace zckpt::testing {

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<uint8_t> ReadFileBytes(const std::string& path);
void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes);
bool FileExists(const std::string& path);
// Names in a folder (not recursive, no "." or ".."), sorted.
std::vector<std::string> ListDir(const std::string& path);

// The interpreter from $ZCKPT_TEST_PYTHON (set by meson test); "" when unset.
std::string TestPython();
// True when TestPython() can `import torch`. Checked once per process.
bool PythonHasTorch();
// Runs `python SCRIPT ARGS...` (SCRIPT relative to the source tree, e.g.
// "tests/pt/make_fixtures.py"); returns the exit status, stdout+stderr in *output if given.
int RunPython(const std::string& script, const std::vector<std::string>& args, std::string* output = nullptr);
// Runs a shell command line; returns its exit status (0..255, or 128+signal), output captured.
int RunCommand(const std::string& command, std::string* output = nullptr);
// Quotes for /bin/sh.
std::string ShellQuote(const std::string& s);
// $ZCKPT_SOURCE_ROOT / $ZCKPT_BUILD_ROOT (set by meson test), or "." when unset.
// Drops the file's pages [offset, offset+len) (len 0: to the end) from the page cache (written
// back first, so every page can go); returns whether O_DIRECT reads work on its filesystem
// (they do not on tmpfs, where nothing can be evicted either).
bool EvictFromPageCache(const std::string& path, uint64_t offset = 0, uint64_t len = 0);
std::string SourceRoot();
std::string BuildRoot();

}  // namespace zckpt::testing

// Skips the current test, saying why, when the project's Python has no torch.
#define ZCKPT_REQUIRE_TORCH()                                                                \
  do {                                                                                       \
    if (!::zckpt::testing::PythonHasTorch())                                                 \
      GTEST_SKIP() << "needs the project's Python with torch ($ZCKPT_TEST_PYTHON='"           \
                   << ::zckpt::testing::TestPython() << "')";                                 \
  } while (0)
