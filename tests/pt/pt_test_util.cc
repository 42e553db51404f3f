#include "pt_test_util.h"

#include <fstream>
#include <sstream>

#include "pt/zip_writer.h"
#include "test_util.h"

namespace zckpt::pt::testing {

namespace {

using zckpt::testing::ReadFileBytes;
using zckpt::testing::RunPython;
using zckpt::testing::TempDir;

std::vector<std::string> SplitTabs(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  std::string field;
  while (std::getline(in, field, '\t')) fields.push_back(field);
  if (!line.empty() && line.back() == '\t') fields.push_back("");
  return fields;
}

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<ExpectedEntry> ParseManifest(const std::string& manifest_path, const std::string& bytes_path) {
  std::vector<ExpectedEntry> entries;
  std::ifstream in(manifest_path);
  if (!in) {
    ADD_FAILURE() << "no manifest " << manifest_path;
    return entries;
  }
  std::vector<uint8_t> blob = ReadFileBytes(bytes_path);
  uint64_t blob_pos = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = SplitTabs(line);
    if (f.size() != 5) {
      ADD_FAILURE() << "bad manifest line in " << manifest_path << ": " << line;
      return {};
    }
    ExpectedEntry e;
    e.name = FromHex(f[0]);
    e.size = std::stoull(f[1]);
    e.crc = static_cast<uint32_t>(std::stoul(f[2]));
    e.data_offset = std::stoull(f[3]);
    e.compress_type = std::stoi(f[4]);
    if (blob_pos + e.size > blob.size()) {
      ADD_FAILURE() << "manifest " << manifest_path << " outruns its bytes file";
      return {};
    }
    e.bytes.assign(blob.begin() + blob_pos, blob.begin() + blob_pos + e.size);
    blob_pos += e.size;
    entries.push_back(std::move(e));
  }
  return entries;
}

std::vector<Fixture> GenerateFixtures(const std::string& dir) {
  std::string output;
  int rc = RunPython("tests/pt/make_fixtures.py", {dir}, &output);
  if (rc != 0) {
    ADD_FAILURE() << "make_fixtures.py failed (" << rc << "):\n" << output;
    return {};
  }
  std::vector<Fixture> fixtures;
  std::ifstream in(dir + "/fixtures.txt");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = SplitTabs(line);
    if (f.size() != 3) {
      ADD_FAILURE() << "bad fixtures.txt line: " << line;
      continue;
    }
    fixtures.push_back(Fixture{f[0], f[1], f[2]});
  }
  return fixtures;
}

}  // namespace

const std::string& FixtureDir() {
  static const TempDir dir;  // removed, with the fixtures, at process exit
  return dir.path();
}

const std::vector<Fixture>& Fixtures() {
  static const std::vector<Fixture> fixtures = GenerateFixtures(FixtureDir());
  return fixtures;
}

std::string Fixture::path() const { return FixtureDir() + "/" + file; }

std::vector<Fixture> FixturesOfKind(const std::string& kind) {
  std::vector<Fixture> out;
  for (const Fixture& f : Fixtures())
    if (f.kind == kind) out.push_back(f);
  return out;
}

const Fixture& FixtureNamed(const std::string& file) {
  for (const Fixture& f : Fixtures())
    if (f.file == file) return f;
  static const Fixture missing;
  ADD_FAILURE() << "no fixture named " << file;
  return missing;
}

std::vector<ExpectedEntry> ReadManifest(const std::string& zip_path) {
  return ParseManifest(zip_path + ".manifest", zip_path + ".bytes");
}

std::vector<ExpectedEntry> DescribeWithPython(const std::string& zip_path) {
  TempDir out;
  std::string output;
  int rc = RunPython("tests/pt/zip_manifest.py", {zip_path, out.File("manifest"), out.File("bytes")}, &output);
  if (rc != 0) {
    ADD_FAILURE() << "zip_manifest.py " << zip_path << " failed (" << rc << "):\n" << output;
    return {};
  }
  return ParseManifest(out.File("manifest"), out.File("bytes"));
}

std::shared_ptr<const MappedFile> MapBytes(std::vector<uint8_t> bytes, const std::string& name) {
  struct Owned {
    std::vector<uint8_t> bytes;
    MappedFile file;
    Owned(std::vector<uint8_t> b, const std::string& n) : bytes(std::move(b)), file(bytes.data(), bytes.size(), n) {}
  };
  auto owned = std::make_shared<Owned>(std::move(bytes), name);
  return std::shared_ptr<const MappedFile>(owned, &owned->file);
}

std::vector<uint8_t> BuildArchive(const std::vector<std::pair<std::string, std::string>>& records,
                                  const std::string& prefix) {
  TempDir dir;
  TorchZipWriter writer(dir.File("a.pt"), prefix);
  for (const auto& [name, data] : records)
    writer.WriteRecord(name, {reinterpret_cast<const uint8_t*>(data.data()), data.size()});
  writer.Commit();
  return ReadFileBytes(dir.File("a.pt"));
}

std::vector<uint8_t> ToBytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

void Put32(std::vector<uint8_t>& bytes, uint64_t offset, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes.at(offset + i) = static_cast<uint8_t>(value >> (8 * i));
}

void Put64(std::vector<uint8_t>& bytes, uint64_t offset, uint64_t value) {
  Put32(bytes, offset, static_cast<uint32_t>(value));
  Put32(bytes, offset + 4, static_cast<uint32_t>(value >> 32));
}

::testing::AssertionResult ThrowsError(const std::function<void()>& fn, ErrorKind kind, const std::string& fragment) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.kind() != kind)
      return ::testing::AssertionFailure() << "threw " << ErrorKindName(e.kind()) << " instead of "
                                           << ErrorKindName(kind) << ": " << e.what();
    if (std::string(e.what()).find(fragment) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << fragment << "': " << e.what();
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-zckpt exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (expected " << ErrorKindName(kind) << ")";
}

}  // namespace zckpt::pt::testing
