// The CPU path's memory bound as a tested invariant, measured in a child process (`zckpt load
// --json`, which resets VmHWM before loading and reports the peak): loading a file far larger
// than the ring costs the destination plus the ring plus a little, whatever the read method;
// loading in place costs the ring. Also `zckpt load`'s exit codes.
#include <gtest/gtest.h>

#include <regex>

#include "loader_test_util.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"

namespace zckpt {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// Under AddressSanitizer (tools/ci/sanitize.sh builds the tool along with the test) every byte the
// loader touches also touches 1/8 byte of shadow memory, which counts in the RSS peak.
#ifdef ZCKPT_UNDER_ASAN  // test_util.h
uint64_t SanitizerShadow(uint64_t touched) { return touched / 8; }
#else
uint64_t SanitizerShadow(uint64_t) { return 0; }
#endif
constexpr uint64_t kStorageBytes = 64 * kMiB;
constexpr int kStorages = 4;  // 256 MiB of tensors; the default ring is 4 x 8 MiB

std::string Zckpt() { return testing::BuildRoot() + "/tools/zckpt"; }

// Written piecewise so the test itself never holds the file in memory.
std::string WriteLarge(const testing::TempDir& dir) {
  std::string path = dir.File("large.zckpt");
  ContainerWriter w(path);
  std::vector<uint8_t> block = testing::RandomBytes(kMiB, 1);
  for (int i = 0; i < kStorages; ++i) {
    NewStorage s{std::string("w").append(std::to_string(i)), "cuda:0", DType::kBFloat16, false};
    w.BeginStorage(s, kStorageBytes);
    for (uint64_t k = 0; k < kStorageBytes / kMiB; ++k) {
      block[k % kMiB] ^= static_cast<uint8_t>(i + 1);  // no two blocks alike
      w.AppendStorage(block);
    }
    w.EndStorage();
    w.AddTensor(NewTensor{"layer" + std::to_string(i), static_cast<uint32_t>(i), DType::kBFloat16,
                          {8192, 4096}, {4096, 1}, 0, 0, ""});
  }
  w.Commit();
  return path;
}

uint64_t Field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\":([0-9]+)"))) return UINT64_MAX;
  return std::stoull(m[1]);
}

struct Loaded {
  int status;
  std::string out;
};

Loaded RunLoad(const std::string& args) {
  Loaded l;
  l.status = testing::RunCommand(testing::ShellQuote(Zckpt()) + " load " + args, &l.out);
  return l;
}

void RequireCli() {
  if (!testing::FileExists(Zckpt())) GTEST_SKIP() << "no zckpt tool at " << Zckpt();
}

class MemoryBound : public ::testing::TestWithParam<std::string> {
 protected:
  // One 256 MiB file for every case of the suite.
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    path_ = WriteLarge(*dir_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static testing::TempDir* dir_;
  static std::string path_;
};
testing::TempDir* MemoryBound::dir_ = nullptr;
std::string MemoryBound::path_;

TEST_P(MemoryBound, PeakIsDestinationPlusRing) {
  RequireCli();
  const std::string& path = path_;
  Loaded l = RunLoad(testing::ShellQuote(path) + " --json " + GetParam());
  ASSERT_EQ(l.status, 0) << l.out;
  if (l.out.find("\"rss_peak_exact\":true") == std::string::npos) GTEST_SKIP() << "VmHWM cannot be reset here";
  uint64_t destination = GetParam().find("--into") != std::string::npos ? 0 : kStorages * kStorageBytes;
  uint64_t ring = Field(l.out, "ring_bytes");
  uint64_t peak = Field(l.out, "rss_peak_delta");
  ASSERT_NE(peak, UINT64_MAX) << l.out;
  // Slack: the index, thread stacks, allocator and page rounding; far below one storage.
  EXPECT_LE(peak, destination + ring + SanitizerShadow(destination + ring) + 16 * kMiB) << l.out;
  EXPECT_GE(peak + 16 * kMiB, destination) << l.out;  // it did load
}

INSTANTIATE_TEST_SUITE_P(Methods, MemoryBound,
                         ::testing::Values("--method pread", "--method mmap", "--method direct",
                                           "--method pread --ring-only", "--method mmap --ring-only",
                                           "--method pread --into", "--method mmap --into --ring-only",
                                           "--method pread --threads 4 --slots 8 --slot-bytes 1M"),
                         [](const auto& info) {
                           std::string n = std::regex_replace(info.param, std::regex("[^a-z0-9]+"), "_");
                           return n.substr(1);
                         });

TEST(LoadCommand, ReportsAndExitCodes) {
  RequireCli();
  testing::TempDir dir;
  testing::Fixture f;
  f.AddContiguous("w", DType::kFloat32, {300, 300}, 1);
  f.AddContiguous("b", DType::kFloat32, {300}, 2);
  std::string path = f.WriteIn(dir, "m.zckpt");

  Loaded ok = RunLoad(testing::ShellQuote(path));
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_NE(ok.out.find("loaded"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("GB/s"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("host RSS: peak"), std::string::npos) << ok.out;
  Loaded js = RunLoad(testing::ShellQuote(path) + " --json --threads 3 --slots 2 --slot-bytes 64K");
  EXPECT_EQ(js.status, 0) << js.out;
  EXPECT_EQ(Field(js.out, "bytes"), 300u * 300 * 4 + 300 * 4) << js.out;
  EXPECT_EQ(Field(js.out, "slot_bytes"), 64u << 10) << js.out;
  EXPECT_NE(js.out.find("\"verified\":true"), std::string::npos) << js.out;
  EXPECT_EQ(RunLoad(testing::ShellQuote(path) + " --map").status, 0);
  EXPECT_EQ(RunLoad(testing::ShellQuote(path) + " --into --json").status, 0);

  auto c = Container::Open(path);
  format::ChunkRecord r = c->chunk(5);
  testing::FlipBit(path, r.offset + 100);
  Loaded bad = RunLoad(testing::ShellQuote(path) + " --json");
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("\"status\":\"corrupt\""), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("chunk 5"), std::string::npos) << bad.out;
  EXPECT_EQ(RunLoad(testing::ShellQuote(path)).status, 1);
  EXPECT_EQ(RunLoad(testing::ShellQuote(path) + " --no-verify").status, 0);

  EXPECT_EQ(RunLoad(testing::ShellQuote(dir.File("missing.zckpt"))).status, 2);
  EXPECT_EQ(RunLoad(testing::ShellQuote(path) + " --method bogus").status, 2);
  EXPECT_EQ(RunLoad(testing::ShellQuote(path) + " --device tpu").status, 2);
  // 0 is the default, as unset: the damaged file's finding (exit 1); a negative count is refused.
  EXPECT_EQ(RunLoad(testing::ShellQuote(path) + " --slots 0").status, 1);
  EXPECT_EQ(RunLoad(testing::ShellQuote(path) + " --slots -1").status, 2);
  EXPECT_EQ(RunLoad("").status, 2);
  Loaded help = RunLoad("--help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("usage: zckpt load"), std::string::npos);
}

}  // namespace
}  // namespace zckpt
