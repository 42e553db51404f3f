// Helpers for the src/pt tests: torch-written fixtures, Python's view of a zip, in-memory
// archives, and error assertions.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mapped_file.h"
#include "zckpt/error.h"

namespace zckpt::pt::testing {

// One zip entry as Python's zipfile reads it (tests/pt/zip_manifest.py).
struct ExpectedEntry {
  std::string name;
  uint64_t size = 0;
  uint32_t crc = 0;
  uint64_t data_offset = 0;
  int compress_type = 0;
  std::vector<uint8_t> bytes;
};

struct Fixture {
  std::string file;    // file name inside FixtureDir()
  std::string kind;    // zip, nocrc, legacy, legacy-tar, torchscript, deflate, plainzip
  std::string prefix;  // the record prefix torch gave it
  std::string path() const;
};

// The fixtures tests/pt/make_fixtures.py writes, generated once per test process into a
// temporary folder. Call ZCKPT_REQUIRE_TORCH() first.
const std::string& FixtureDir();
const std::vector<Fixture>& Fixtures();
std::vector<Fixture> FixturesOfKind(const std::string& kind);
const Fixture& FixtureNamed(const std::string& file);

// Python's reading of a zip: the manifest written by the fixture script, or, for any zip, by
// running zip_manifest.py now (which also fails on a bad CRC). Empty + test failure on error.
std::vector<ExpectedEntry> ReadManifest(const std::string& zip_path);
std::vector<ExpectedEntry> DescribeWithPython(const std::string& zip_path);

// Owns a byte buffer and a MappedFile wrapping it (exact size, so a sanitizer sees overreads).
std::shared_ptr<const MappedFile> MapBytes(std::vector<uint8_t> bytes, const std::string& name = "<memory>");

// Writes records with TorchZipWriter into a temporary file and returns the archive's bytes.
std::vector<uint8_t> BuildArchive(const std::vector<std::pair<std::string, std::string>>& records,
                                  const std::string& prefix = "archive");

std::vector<uint8_t> ToBytes(const std::string& s);
void Put32(std::vector<uint8_t>& bytes, uint64_t offset, uint32_t value);
void Put64(std::vector<uint8_t>& bytes, uint64_t offset, uint64_t value);

// Runs `fn`, expects a zckpt::Error of `kind` whose message contains `fragment`.
::testing::AssertionResult ThrowsError(const std::function<void()>& fn, ErrorKind kind, const std::string& fragment);

}  // namespace zckpt::pt::testing

#define EXPECT_ZCKPT_ERROR(statement, kind, fragment) \
  EXPECT_TRUE(::zckpt::pt::testing::ThrowsError([&] { statement; }, kind, fragment))
