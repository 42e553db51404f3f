// Helpers shared by the pickle suites: building pickles opcode by opcode, expecting errors,
// and fixtures written once per test process by the Python scripts in this folder.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pickle/unpickler.h"
#include "zckpt/error.h"

namespace zckpt::pickle::testing {

// Appends opcodes and operands; little-endian where pickle is.
class PickleBuilder {
 public:
  PickleBuilder& Op(uint8_t code) { bytes_.push_back(code); return *this; }
  PickleBuilder& Raw(std::string_view s) { bytes_.insert(bytes_.end(), s.begin(), s.end()); return *this; }
  PickleBuilder& LE(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  PickleBuilder& Proto(int p) { return Op(0x80).LE(static_cast<uint64_t>(p), 1); }
  PickleBuilder& Stop() { return Op('.'); }
  PickleBuilder& Mark() { return Op('('); }
  PickleBuilder& Int1(uint8_t v) { return Op('K').LE(v, 1); }
  PickleBuilder& Unicode(std::string_view s) { return Op('X').LE(s.size(), 4).Raw(s); }
  PickleBuilder& ShortUnicode(std::string_view s) { return Op(0x8c).LE(s.size(), 1).Raw(s); }
  // GLOBAL 'module\nname\n'
  PickleBuilder& Global(std::string_view module, std::string_view name) {
    return Op('c').Raw(module).Raw("\n").Raw(name).Raw("\n");
  }
  PickleBuilder& StackGlobal(std::string_view module, std::string_view name) {
    return ShortUnicode(module).ShortUnicode(name).Op(0x93);
  }
  PickleBuilder& Inst(std::string_view module, std::string_view name) {
    return Op('i').Raw(module).Raw("\n").Raw(name).Raw("\n");
  }
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

std::vector<uint8_t> ToBytes(std::string_view s);
// A string literal's bytes, embedded NULs included (the terminating one excluded).
template <size_t N>
std::vector<uint8_t> ToBytes(const char (&s)[N]) {
  return std::vector<uint8_t>(s, s + N - 1);
}

// Runs `fn`; returns the zckpt::Error it throws (fails the test when it throws nothing).
Error CatchError(const std::function<void()>& fn);
// Unpickle that must fail with `kind` and a message containing `what`.
void ExpectUnpickleError(const std::vector<uint8_t>& bytes, ErrorKind kind, const std::string& what,
                         const UnpickleOptions& options = {});

// Runs `python SCRIPT OUTDIR` once per process per script (SCRIPT relative to the source
// root) and returns OUTDIR; "" (after a test failure) when the script failed.
std::string FixtureDir(const std::string& script);

// "2,3" for {2, 3}; "-" for none (the fixture scripts' notation).
std::string Csv(const std::vector<int64_t>& v);

// Lines of a text file, split on tabs.
std::vector<std::vector<std::string>> ReadTable(const std::string& path);
std::vector<uint8_t> ReadBytes(const std::string& path);

}  // namespace zckpt::pickle::testing
