// Concurrency: many readers of one container, in threads and in processes, while other
// processes write into the same folder and rewrite a destination the readers also read.
//
// What must hold every time: a reader sees a complete, good file with exactly the expected
// contents (digests of everything read are equal), never a partial one; nothing crashes; and,
// in the ThreadSanitizer build (tools/ci/sanitize.sh), no data race is reported.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "hardening_util.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt::hardening {
namespace {

using testing::FileExists;
using testing::RunCommand;
using testing::RunPython;
using testing::ShellQuote;
using testing::TempDir;

namespace fs = std::filesystem;

double Seconds() { return EnvDouble("ZCKPT_HARDENING_SECONDS", 6.0); }

bool Elapsed(std::chrono::steady_clock::time_point start, double seconds) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= seconds;
}

// One read of a container: open, verify, digest. Returns "" when it matched, else what went wrong.
std::string ReadOnce(const std::string& path, uint64_t expected, unsigned verify_threads) {
  try {
    auto c = Container::Open(path);
    VerifyOptions vo;
    vo.threads = verify_threads;
    VerifyReport r = c->Verify(vo);
    if (!r.ok()) return path + ": verify: " + r.problems[0].message;
    uint64_t got = DigestContainer(*c);
    if (got != expected) return path + ": digest " + std::to_string(got) + " != " + std::to_string(expected);
    return "";
  } catch (const std::exception& e) {
    return path + ": " + e.what();
  }
}

// Forks a child that runs `body` until `stop_file` exists or `seconds` pass; the child exits 0 when
// body always returned "", else 1 after printing the first problem. Must be called while the
// process has a single thread.
pid_t ForkLoop(const std::string& stop_file, double seconds, const std::function<std::string()>& body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid != 0) return pid;
  auto start = std::chrono::steady_clock::now();
  int iterations = 0;
  do {
    std::string problem = body();
    if (!problem.empty()) {
      std::fprintf(stderr, "child %d, iteration %d: %s\n", static_cast<int>(getpid()), iterations, problem.c_str());
      std::fflush(stderr);
      _exit(1);
    }
    ++iterations;
  } while (!FileExists(stop_file) && !Elapsed(start, seconds * 3));
  _exit(0);
}

struct Writers {
  std::vector<pid_t> pids;
  std::string how;
};

// Starts the writers: one converts a different file into the folder over and over, one rewrites
// `rewritten` (which the readers also read) over and over. With torch: `zckpt convert` in shell
// loops. Without: forked children writing with ContainerWriter. Single-threaded caller.
Writers StartWriters(const TempDir& dir, const std::string& folder, const std::string& rewritten,
                     const std::string& stop_file, double seconds, uint64_t rewritten_seed, bool use_tool) {
  Writers w;
  if (use_tool) {
    w.how = "zckpt convert processes";
    const std::string tool = ZckptTool();
    for (auto [src, dst] : {std::pair{dir.File("other.pt"), folder + "/other.zckpt"},
                            std::pair{dir.File("rewrite.pt"), rewritten}}) {
      std::string loop = "while [ ! -e " + ShellQuote(stop_file) + " ]; do " + ShellQuote(tool) + " convert --quiet --force --zstd 1 " +
                         ShellQuote(src) + " -o " + ShellQuote(dst) + " || exit 1; echo converted; done";
      w.pids.push_back(Spawn({"/bin/sh", "-c", loop}, dir.File("writer" + std::to_string(w.pids.size()) + ".log")));
    }
  } else {
    w.how = "forked ContainerWriter processes";
    uint64_t seed = 100;
    w.pids.push_back(ForkLoop(stop_file, seconds, [=]() mutable {
      WriteSampleContainer(folder + "/other.zckpt", seed++, 8, 1 << 20, 1);
      return std::string();
    }));
    w.pids.push_back(ForkLoop(stop_file, seconds, [=] {
      WriteSampleContainer(rewritten, rewritten_seed, 8, 1 << 20, 1);
      return std::string();
    }));
  }
  return w;
}

TEST(Concurrency, ManyReadersWhileOthersWriteTheSameFolder) {
  TempDir dir;
  const std::string folder = dir.File("shared");
  fs::create_directory(folder);
  const std::string a = folder + "/a.zckpt", rewritten = folder + "/b.zckpt";
  const std::string stop_file = dir.File("STOP");
  const double seconds = Seconds();
  const std::string tool = ZckptTool();
  const bool use_tool = !tool.empty() && testing::PythonHasTorch();

  WriteSampleContainer(a, 1, 12, 1 << 20, 3);
  const uint64_t digest_a = DigestFile(a);
  // The rewritten destination: its contents are the same on every rewrite, so one digest.
  uint64_t digest_b;
  if (use_tool) {
    std::string out;
    ASSERT_EQ(RunPython("tests/hardening/make_pt.py", {dir.File("other.pt"), "6", "5"}, &out), 0) << out;
    ASSERT_EQ(RunPython("tests/hardening/make_pt.py", {dir.File("rewrite.pt"), "6", "6"}, &out), 0) << out;
    ASSERT_EQ(RunCommand(ShellQuote(tool) + " convert --quiet --force --zstd 1 " + ShellQuote(dir.File("rewrite.pt")) + " -o " + ShellQuote(rewritten), &out), 0) << out;
  } else {
    WriteSampleContainer(rewritten, 2, 8, 1 << 20, 1);
  }
  digest_b = DigestFile(rewritten);

  // Processes first, while this process has one thread (fork).
  std::vector<pid_t> readers;
  for (int p = 0; p < 4; ++p) {
    readers.push_back(ForkLoop(stop_file, seconds, [&] {
      std::string problem = ReadOnce(a, digest_a, 2);
      if (problem.empty()) problem = ReadOnce(rewritten, digest_b, 1);
      return problem;
    }));
  }
  Writers writers = StartWriters(dir, folder, rewritten, stop_file, seconds, 2, use_tool);

  // Threads: half open their own Container each time, half share one.
  std::unique_ptr<Container> shared = Container::Open(a);
  std::atomic<int> iterations{0};
  std::mutex mu;
  std::vector<std::string> problems;
  auto report = [&](const std::string& p) {
    std::lock_guard<std::mutex> lock(mu);
    if (problems.size() < 10) problems.push_back(p);
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      while (!Elapsed(start, seconds)) {
        std::string problem;
        if (t % 2 == 0) {
          problem = ReadOnce(a, digest_a, 2);
        } else {
          try {
            VerifyOptions vo;
            vo.threads = 2;
            if (!shared->Verify(vo).ok()) problem = "shared container failed to verify";
            else if (DigestContainer(*shared) != digest_a) problem = "shared container digest differs";
            else if (!shared->FindTensor("t3.weight")) problem = "lookup failed";
          } catch (const std::exception& e) {
            problem = e.what();
          }
        }
        if (problem.empty()) problem = ReadOnce(rewritten, digest_b, 1);
        if (!problem.empty()) report("thread " + std::to_string(t) + ": " + problem);
        iterations++;
      }
    });
  }
  // `zckpt verify` processes, one after another, on both files (and `zckpt load` when built).
  int tool_runs = 0, load_runs = 0;
  std::string first_load_output;
  if (!tool.empty()) {
    while (!Elapsed(start, seconds)) {
      std::string out;
      int rc = RunCommand(ShellQuote(tool) + " verify --quiet " + ShellQuote(a) + " " + ShellQuote(rewritten), &out);
      if (rc != 0) report("zckpt verify exited " + std::to_string(rc) + ": " + out);
      tool_runs++;
      if (ZckptLoadAvailable()) {
        rc = RunCommand(ShellQuote(tool) + " load --device cpu --json " + ShellQuote(a) + " 2>/dev/null", &out);
        if (rc != 0) report("zckpt load exited " + std::to_string(rc) + ": " + out);
        load_runs++;
      }
    }
  }
  for (auto& th : threads) th.join();
  testing::WriteFileBytes(stop_file, {});

  for (pid_t pid : readers) {
    int status = Wait(pid);
    if (status != 0) report("reader process exited " + std::to_string(status) + " (its stderr above)");
  }
  int conversions = 0;
  for (size_t i = 0; i < writers.pids.size(); ++i) {
    int status = Wait(writers.pids[i]);
    std::string log;
    if (use_tool) {
      std::vector<uint8_t> bytes = testing::ReadFileBytes(dir.File("writer" + std::to_string(i) + ".log"));
      log.assign(bytes.begin(), bytes.end());
      for (size_t at = 0; (at = log.find("converted\n", at)) != std::string::npos; at += 10) conversions++;
    }
    if (status != 0) report("writer " + std::to_string(i) + " (" + writers.how + ") exited " + std::to_string(status) + ": " + log);
  }
  std::printf("%d thread reads, %d zckpt verify runs, %d zckpt load runs (%s); writers: %s, %d conversions\n",
              iterations.load(), tool_runs, load_runs, ZckptLoadAvailable() ? "built" : "not in this build",
              writers.how.c_str(), conversions);
  for (const auto& p : problems) ADD_FAILURE() << p;
  EXPECT_GT(iterations.load(), 8);
  // The rewritten file is still good, and the folder holds no stray temporaries.
  EXPECT_EQ(DigestFile(rewritten), digest_b);
  for (const std::string& e : testing::ListDir(folder)) {
    EXPECT_TRUE(e == "a.zckpt" || e == "b.zckpt" || e == "other.zckpt") << "left in the folder: " << e;
  }
}

// Two writers racing for one destination: every rename is of a complete file, so whoever wins,
// the destination verifies, and neither writer fails because of the other.
TEST(Concurrency, RacingWritersOfOneDestination) {
  TempDir dir;
  const std::string dest = dir.File("race.zckpt");
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 6; ++i) {
        try {
          WriteSampleContainer(dest, 42, 6, 256 << 10, t % 2 ? 1 : 0);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "writer %d: %s\n", t, e.what());
          failures++;
        }
      }
    });
  }
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done) {
      if (!FileExists(dest)) continue;
      try {
        auto c = Container::Open(dest);
        if (!c->Verify().ok()) failures++;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "reader: %s\n", e.what());
        failures++;
      }
    }
  });
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(testing::ListDir(dir.path()), std::vector<std::string>{"race.zckpt"});
}

// Two writers of one destination whose lifetimes overlap (atomic_file.h, "Two writers"): the last
// rename wins, and that writer says it replaced a file another writer committed meanwhile; a
// writer that began after the other's commit (a plain overwrite, as --force) says nothing.
std::vector<std::string> g_notes;
void KeepNote(const std::string& note) { g_notes.push_back(note); }

std::string Content(const std::string& path) {
  std::vector<uint8_t> b = testing::ReadFileBytes(path);
  return {b.begin(), b.end()};
}

TEST(Concurrency, OverlappingWritersLastRenameWinsAndSaysSo) {
  TempDir dir;
  const std::string dest = dir.File("latest.zckpt");
  SetCommitNoteHandler(KeepNote);
  g_notes.clear();
  for (bool existed : {false, true}) {
    SCOPED_TRACE(existed ? "over an existing destination" : "no destination yet");
    if (existed) {
      AtomicFile old(dest);
      old.Write("old", 3);
      EXPECT_EQ(old.Commit(), "");
    }
    AtomicFile first(dest), second(dest);
    first.Write("first", 5);
    second.Write("second", 6);
    EXPECT_EQ(second.Commit(), "") << "the destination had not changed since it began";
    EXPECT_EQ(Content(dest), "second");
    const std::string note = first.Commit();
    EXPECT_EQ(Content(dest), "first");  // last rename wins, whole
    EXPECT_NE(note.find(dest), std::string::npos) << note;
    EXPECT_NE(note.find("last rename wins"), std::string::npos) << note;
    ASSERT_EQ(g_notes.size(), 1u);
    EXPECT_EQ(g_notes[0], note);
    g_notes.clear();
    // Sequential: began after the last commit, nothing to say.
    AtomicFile later(dest);
    later.Write("later", 5);
    EXPECT_EQ(later.Commit(), "");
    EXPECT_TRUE(g_notes.empty());
    EXPECT_EQ(testing::ListDir(dir.path()), std::vector<std::string>{"latest.zckpt"});
    std::filesystem::remove(dest);
  }
  SetCommitNoteHandler(nullptr);
}

}  // namespace
}  // namespace zckpt::hardening
