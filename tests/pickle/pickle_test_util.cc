#include "pickle_test_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "test_util.h"

namespace zckpt::pickle::testing {

std::vector<uint8_t> ToBytes(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }

Error CatchError(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a zckpt::Error, nothing was thrown";
  return Error(ErrorKind::kIo, "<no error>");
}

void ExpectUnpickleError(const std::vector<uint8_t>& bytes, ErrorKind kind, const std::string& what,
                         const UnpickleOptions& options) {
  Error e = CatchError([&] { Unpickle(bytes, options); });
  EXPECT_EQ(ErrorKindName(e.kind()), std::string(ErrorKindName(kind))) << e.what();
  EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "message: " << e.what() << "\nwanted: " << what;
}

std::string FixtureDir(const std::string& script) {
  // Folders live until the process ends; one per script.
  static std::map<std::string, std::unique_ptr<zckpt::testing::TempDir>> dirs;
  static std::map<std::string, bool> ok;
  auto it = dirs.find(script);
  if (it == dirs.end()) {
    auto dir = std::make_unique<zckpt::testing::TempDir>();
    std::string output;
    int rc = zckpt::testing::RunPython(script, {dir->path()}, &output);
    ok[script] = rc == 0;
    if (rc != 0) ADD_FAILURE() << script << " failed (" << rc << "):\n" << output;
    it = dirs.emplace(script, std::move(dir)).first;
  }
  return ok[script] ? it->second->path() : "";
}

std::string Csv(const std::vector<int64_t>& v) {
  if (v.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::vector<std::vector<std::string>> ReadTable(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, '\t')) cells.push_back(cell);
    rows.push_back(std::move(cells));
  }
  return rows;
}

std::vector<uint8_t> ReadBytes(const std::string& path) { return zckpt::testing::ReadFileBytes(path); }

}  // namespace zckpt::pickle::testing
