// Crash safety: a conversion killed at any point, a full disk, a failing write.
//
// The promise under test (common/atomic_file.h): the destination name only ever holds a
// complete file. A writer that dies leaves the old destination (or none) and at worst a
// `.NAME.zckpt-tmp-*` temporary; a writer that fails (ENOSPC, EIO) throws Error(kIo) naming the
// destination and the cause, removes its temporary, and leaves the old destination
// byte-identical. The next write to the destination removes a dead writer's temporary
// (stale_temp_test.cc tests that part alone).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "hardening_util.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt::hardening {
namespace {

using testing::FileExists;
using testing::ListDir;
using testing::RunCommand;
using testing::RunPython;
using testing::ShellQuote;
using testing::TempDir;

namespace fs = std::filesystem;

// Size of the .pt the kill test converts: 200 MB unless ZCKPT_HARDENING_PT_MB says otherwise.
double KillTestMegabytes() { return EnvDouble("ZCKPT_HARDENING_PT_MB", 200.0); }

void MakePt(const std::string& path, double mb, int seed, bool legacy = false) {
  std::vector<std::string> args = {path, std::to_string(mb), std::to_string(seed)};
  if (legacy) args.push_back("--legacy");
  std::string out;
  ASSERT_EQ(RunPython("tests/hardening/make_pt.py", args, &out), 0) << out;
}

void ExpectGoodContainer(const std::string& path, uint64_t digest) {
  auto c = Container::Open(path);
  VerifyReport r = c->Verify();
  ASSERT_TRUE(r.ok()) << path << ": " << r.problems[0].message;
  EXPECT_EQ(DigestContainer(*c), digest) << path;
}

// A failed write: kind kIo, and a message that names the destination and the cause.
void ExpectIoError(const Error& e, const std::string& destination, const std::string& cause) {
  EXPECT_EQ(e.kind(), ErrorKind::kIo) << ErrorKindName(e.kind()) << ": " << e.what();
  std::string what = e.what();
  EXPECT_NE(what.find(destination), std::string::npos) << "message does not name " << destination << ": " << what;
  EXPECT_NE(what.find(cause), std::string::npos) << "message does not say '" << cause << "': " << what;
}

// Resets the write-failure hook even when an assertion returns early.
struct FailHookGuard {
  ~FailHookGuard() { SetAtomicFileFailAfterWrites(0); }
};

// ---------------------------------------------------------------------------------------------
// SIGKILL at random points of `zckpt convert`.
// ---------------------------------------------------------------------------------------------

TEST(CrashSafety, ConvertKilledAtRandomPointsLeavesNoPartialDestination) {
  ZCKPT_REQUIRE_TORCH();
  const std::string tool = ZckptTool();
  if (tool.empty()) GTEST_SKIP() << "no zckpt tool in this build";
  TempDir dir;
  const std::string src = dir.File("model.pt"), old_src = dir.File("old.pt");
  MakePt(src, KillTestMegabytes(), 1);
  MakePt(old_src, 0.5, 2);
  fs::create_directory(dir.File("out"));
  fs::create_directory(dir.File("cal"));
  const std::string out_dir = dir.File("out"), dest = dir.File("out/model.zckpt");
  const std::string old_container = dir.File("cal/old.zckpt");

  // Calibration: a full conversion, its time and what it holds.
  auto t0 = std::chrono::steady_clock::now();
  std::string log;
  ASSERT_EQ(RunCommand(ShellQuote(tool) + " convert --quiet --force " + ShellQuote(src) + " -o " + ShellQuote(dir.File("cal/model.zckpt")), &log), 0) << log;
  const double full_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t new_digest = DigestFile(dir.File("cal/model.zckpt"));
  ASSERT_EQ(RunCommand(ShellQuote(tool) + " convert --quiet --force " + ShellQuote(old_src) + " -o " + ShellQuote(old_container), &log), 0) << log;
  const uint64_t old_checksum = FileChecksum(old_container);
  std::printf("full conversion of %.0f MB: %.2f s\n", KillTestMegabytes(), full_s);

  std::mt19937_64 rng(20240611);
  int killed = 0, finished = 0;
  for (int i = 0; i < 10; ++i) {
    // Odd runs replace an existing good file; even runs write a new name.
    const bool has_old = i % 2 == 1;
    std::error_code ec;
    fs::remove(dest, ec);
    if (has_old) fs::copy_file(old_container, dest, ec);
    // Delays spread over the whole conversion (startup, pickle, storages, index, commit).
    double frac = (i + std::uniform_real_distribution<double>(0.0, 1.0)(rng)) / 10.0;
    auto delay = std::chrono::microseconds(static_cast<int64_t>(frac * full_s * 1e6));
    pid_t pid = Spawn({tool, "convert", "--quiet", "--force", src, "-o", dest});
    std::this_thread::sleep_for(delay);
    ::kill(pid, SIGKILL);
    int status = Wait(pid);
    SCOPED_TRACE("run " + std::to_string(i) + ", killed after " + std::to_string(delay.count() / 1000) + " ms, exit " +
                 std::to_string(status) + (has_old ? ", replacing a good file" : ", new file"));
    ASSERT_TRUE(status == 128 + SIGKILL || status == 0) << "convert exited " << status;
    (status == 0 ? finished : killed)++;

    // Nothing but the destination and our temporaries in the folder.
    std::vector<std::string> bad = UnexpectedEntries(out_dir, {"model.zckpt"}, "model.zckpt");
    EXPECT_TRUE(bad.empty()) << "unexpected entry " << bad[0];
    // The destination is the old file, byte for byte, or the complete new one, or absent.
    if (FileExists(dest)) {
      if (has_old && FileChecksum(dest) == old_checksum) continue;
      ExpectGoodContainer(dest, new_digest);
    }
  }
  std::vector<std::string> stale;
  for (const std::string& e : ListDir(out_dir))
    if (IsTempOf(e, "model.zckpt")) stale.push_back(e);
  // A killed writer cannot remove its temporary; the next write to the same destination does,
  // once it is kStaleTempSeconds old (younger ones may still be between create and flock).
  std::printf("%d runs killed, %d finished before the kill; %zu stale temporaries left\n", killed, finished, stale.size());
  EXPECT_LE(stale.size(), static_cast<size_t>(killed));
  EXPECT_GE(killed, 3) << "too few runs were killed mid-way to test anything";
  for (const std::string& e : stale) {
    struct timespec times[2] = {{0, UTIME_OMIT}, {std::time(nullptr) - kStaleTempSeconds - 1, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, (out_dir + "/" + e).c_str(), times, 0), 0) << e;
  }

  // A re-run over whatever was left succeeds, verifies, and removes the dead runs' temporaries.
  ASSERT_EQ(RunCommand(ShellQuote(tool) + " convert --quiet --force " + ShellQuote(src) + " -o " + ShellQuote(dest), &log), 0) << log;
  ExpectGoodContainer(dest, new_digest);
  ASSERT_EQ(RunCommand(ShellQuote(tool) + " verify --quiet " + ShellQuote(dest), &log), 0) << log;
  EXPECT_EQ(ListDir(out_dir), std::vector<std::string>{"model.zckpt"}) << "stale temporaries not cleaned up";
}

// ---------------------------------------------------------------------------------------------
// ENOSPC on a small tmpfs.
// ---------------------------------------------------------------------------------------------

class SmallTmpfs {
 public:
  explicit SmallTmpfs(const std::string& dir, const char* size) : dir_(dir) {
    fs::create_directory(dir);
    mounted_ = RunCommand("mount -t tmpfs -o size=" + std::string(size) + " zckpt-hardening " + ShellQuote(dir), &why_) == 0;
  }
  ~SmallTmpfs() {
    if (mounted_) RunCommand("umount " + ShellQuote(dir_) + " || umount -l " + ShellQuote(dir_));
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string why_;
};

std::vector<uint8_t> Bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(CrashSafety, FullDiskFailsCleanlyAndKeepsTheOldFile) {
  TempDir dir;
  SmallTmpfs fs_small(dir.File("mnt"), "2m");
  if (!fs_small.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): " << fs_small.why();
  const std::string mnt = dir.File("mnt"), dest = mnt + "/x.zckpt";

  // A good file first (small, fits).
  WriteSampleContainer(dest, 7, 4, 64 << 10, 0);
  const uint64_t old_checksum = FileChecksum(dest);

  // ContainerWriter: a storage larger than the filesystem.
  try {
    ContainerWriter w(dest, {});
    std::vector<uint8_t> big = Bytes(6 << 20, 1);
    w.AddStorage(NewStorage{"big"}, big);
    w.Commit();
    ADD_FAILURE() << "writing 6 MiB to a 2 MiB tmpfs succeeded";
  } catch (const Error& e) {
    ExpectIoError(e, dest, std::strerror(ENOSPC));
  }
  EXPECT_EQ(ListDir(mnt), std::vector<std::string>{"x.zckpt"});
  EXPECT_EQ(FileChecksum(dest), old_checksum);

  // A 1 MiB write, small enough for the buffered path, then a commit that overflows.
  try {
    WriterOptions o;
    o.threads = 1;
    ContainerWriter w(dest, o);
    for (int i = 0; i < 3; ++i) w.AddStorage(NewStorage{"s" + std::to_string(i)}, Bytes(700 << 10, i));
    w.Commit();
    ADD_FAILURE() << "writing 2.1 MiB to a 2 MiB tmpfs holding a file succeeded";
  } catch (const Error& e) {
    ExpectIoError(e, dest, std::strerror(ENOSPC));
  }
  EXPECT_EQ(ListDir(mnt), std::vector<std::string>{"x.zckpt"});
  EXPECT_EQ(FileChecksum(dest), old_checksum);
  ExpectGoodContainer(dest, DigestFile(dest));

  if (!testing::PythonHasTorch()) {
    std::printf("ConvertFile / ExportFile / zckpt convert on a full disk skipped: no torch\n");
    return;
  }
  const std::string src = dir.File("src.pt");
  MakePt(src, 4, 3);
  // ConvertFile in process.
  try {
    ConvertFile(src, dest, ConvertOptions{});
    ADD_FAILURE() << "converting 4 MB onto a 2 MiB tmpfs succeeded";
  } catch (const Error& e) {
    ExpectIoError(e, dest, std::strerror(ENOSPC));
  }
  EXPECT_EQ(ListDir(mnt), std::vector<std::string>{"x.zckpt"});
  EXPECT_EQ(FileChecksum(dest), old_checksum);

  // ExportFile in process: a container outside, exported onto the full disk over an old .pt.
  const std::string container = dir.File("src.zckpt"), pt_dest = mnt + "/y.pt";
  ConvertFile(src, container, ConvertOptions{});
  testing::WriteFileBytes(pt_dest, {1, 2, 3});
  try {
    ExportFile(container, pt_dest);
    ADD_FAILURE() << "exporting 4 MB onto a 2 MiB tmpfs succeeded";
  } catch (const Error& e) {
    ExpectIoError(e, pt_dest, std::strerror(ENOSPC));
  }
  EXPECT_EQ(ListDir(mnt), (std::vector<std::string>{"x.zckpt", "y.pt"}));
  EXPECT_EQ(testing::ReadFileBytes(pt_dest), (std::vector<uint8_t>{1, 2, 3}));

  // The command line: exit 2 and the cause on stderr.
  const std::string tool = ZckptTool();
  if (!tool.empty()) {
    std::string out;
    int rc = RunCommand(ShellQuote(tool) + " convert --quiet --force " + ShellQuote(src) + " -o " + ShellQuote(dest), &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find(std::strerror(ENOSPC)), std::string::npos) << out;
    EXPECT_EQ(ListDir(mnt), (std::vector<std::string>{"x.zckpt", "y.pt"}));
    EXPECT_EQ(FileChecksum(dest), old_checksum);
  }
}

// ---------------------------------------------------------------------------------------------
// An injected write error (EIO at the Nth write) at every point of a write.
// ---------------------------------------------------------------------------------------------

// Runs `write` with the Nth write failing, N = 1, 2, ..., until a run succeeds; every failing run
// must throw kIo naming `dest`, remove its temporary and leave `dest` as it was. Returns the
// number of failing runs.
template <typename Write>
int FailEveryWrite(const std::string& dir, const std::string& dest, Write&& write, int max_n = 400) {
  FailHookGuard guard;
  const std::vector<std::string> before = ListDir(dir);
  const bool had_dest = FileExists(dest);
  const uint64_t old_checksum = had_dest ? FileChecksum(dest) : 0;
  const std::string cause = std::strerror(EIO);
  for (int n = 1; n <= max_n; ++n) {
    SCOPED_TRACE("write " + std::to_string(n) + " fails");
    SetAtomicFileFailAfterWrites(n);
    bool ok = false;
    try {
      write();
      ok = true;
    } catch (const Error& e) {
      ExpectIoError(e, dest, cause);
    }
    SetAtomicFileFailAfterWrites(0);
    if (ok) return n - 1;
    EXPECT_EQ(ListDir(dir), before) << "temporary left behind or destination removed";
    EXPECT_EQ(FileExists(dest), had_dest);
    if (had_dest) {
      EXPECT_EQ(FileChecksum(dest), old_checksum) << "destination changed by a failed write";
    }
    if (::testing::Test::HasFailure()) return n;
  }
  ADD_FAILURE() << "still failing after " << max_n << " injected errors";
  return max_n;
}

TEST(CrashSafety, InjectedWriteErrorInContainerWriter) {
  TempDir dir;
  const std::string dest = dir.File("w.zckpt");
  for (bool existing : {false, true}) {
    SCOPED_TRACE(existing ? "over an existing file" : "new file");
    if (existing) WriteSampleContainer(dest, 11, 3, 4096, 0);
    int failures = FailEveryWrite(dir.path(), dest, [&] { WriteSampleContainer(dest, 5, 10, 3 << 20, 3, 1 << 20); });
    std::printf("ContainerWriter (%s): %d distinct failing writes, each clean\n", existing ? "replace" : "new", failures);
    EXPECT_GE(failures, 3);
    Container::Open(dest);
    ExpectGoodContainer(dest, DigestFile(dest));
    if (::testing::Test::HasFailure()) return;
  }
  // A write failing after the hook is reset must not happen: one more plain write succeeds.
  WriteSampleContainer(dest, 6, 3, 4096, 0);
}

TEST(CrashSafety, InjectedWriteErrorInConvertAndExport) {
  ZCKPT_REQUIRE_TORCH();
  TempDir dir;
  for (bool legacy : {false, true}) {
    SCOPED_TRACE(legacy ? "legacy source" : "zip source");
    const std::string src = dir.File(legacy ? "legacy.pt" : "zip.pt");
    MakePt(src, 3, 4, legacy);
    const std::string dest = dir.File("out.zckpt");
    std::error_code ec;
    fs::remove(dest, ec);
    ConvertOptions co;
    co.writer.chunk_bytes = 1 << 20;
    int f1 = FailEveryWrite(dir.path(), dest, [&] { ConvertFile(src, dest, co); });
    // And over the good file it just wrote.
    int f2 = FailEveryWrite(dir.path(), dest, [&] { ConvertFile(src, dest, co); });
    EXPECT_EQ(f1, f2);
    ExpectGoodContainer(dest, DigestFile(dest));

    const std::string back = dir.File("back.pt");
    fs::remove(back, ec);
    int f3 = FailEveryWrite(dir.path(), back, [&] { ExportFile(dest, back); });
    int f4 = FailEveryWrite(dir.path(), back, [&] { ExportFile(dest, back); });
    EXPECT_EQ(f3, f4);
    std::printf("%s: ConvertFile %d, ExportFile %d failing writes, each clean\n", legacy ? "legacy" : "zip", f1, f3);
    EXPECT_GE(f1, 1);
    EXPECT_GE(f3, 1);
    if (legacy) {
      EXPECT_EQ(FileChecksum(back), FileChecksum(src)) << "legacy export is not byte-identical";
    }
    fs::remove(back, ec);
    fs::remove(dest, ec);
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace zckpt::hardening
