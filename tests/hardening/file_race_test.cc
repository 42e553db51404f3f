// Files that another process truncates or rewrites while zckpt reads them (issue 11, items 1 and
// 2), against the format layer (Open, Verify, ReadChunk, CheckedBlobBytes) and the loader's
// torch-free pipeline with every read method (pread straight into destinations, ring slots, mmap
// through GuardedCopy, O_DIRECT, zstd chunks).
//
// What must hold: a read of a file that shrank ends in Error(kIo) naming the file, never a SIGBUS;
// a file rewritten in place is caught by the checksums or does not matter (what was checked is
// what is delivered: a chunk read with checks is either the original bytes or an error), and no
// rewrite of the index after Open changes a bound (the sanitizers watch for overflows).
//
// The deterministic cases truncate at a known point (after Open; from the progress callback in the
// middle of a load or verify); the races run a second thread truncating or rewriting the file
// while loads and verifications loop, long enough to hit the window many times (and they assert
// that it was hit).
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/fault_guard.h"
#include "common/mapped_file.h"
#include "format/bytes.h"
#include "hardening_util.h"
#include "loader/plan.h"
#include "loader/stream.h"
#include "pipeline_target.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/load_options.h"

namespace zckpt::hardening {
namespace {

using Clock = std::chrono::steady_clock;

// ~6 MiB over 24 storages of 64 KiB chunks: raw and zstd chunks, small (slot) and large (direct)
// storages, a blob at the end.
struct RaceSample : Sample {
  explicit RaceSample(int zstd = 3, uint64_t seed = 1) : Sample(64 << 10, zstd, seed, 24, 1 << 20) {}
};

bool Shrank(const Error& e, const std::string& path) {
  std::string m = e.what();
  return e.kind() == ErrorKind::kIo && m.find(path) != std::string::npos && m.find("changed size") != std::string::npos;
}

void Truncate(const std::string& path, uint64_t size) { ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0); }

// Error kinds a file changing under a reader may legitimately produce.
bool RaceKind(ErrorKind k) { return k == ErrorKind::kIo || k == ErrorKind::kCorrupt || k == ErrorKind::kNotContainer; }

const ReadMethod kMethods[] = {ReadMethod::kPread, ReadMethod::kMmap, ReadMethod::kDirect};

// --- the SIGBUS guard itself ---

// Each fault is turned into `false`, again and again on the same thread and on others (a handler
// left blocked after the first would let the second kill the process), and memory that does not
// fault is copied as usual.
TEST(FileRace, GuardedCopyTurnsEverySigbusIntoFalse) {
  RaceSample sample;
  MappedFile m(sample.path);
  std::vector<uint8_t> head(4096), tail(4096);
  Truncate(sample.path, 8192);
  EXPECT_TRUE(GuardedCopy(head.data(), m.data(), head.size()));
  const std::vector<uint8_t> left = testing::ReadFileBytes(sample.path);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), left.begin()));
  const uint8_t* gone = m.data() + m.size() - 4096;
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(GuardedCopy(tail.data(), gone, tail.size())) << "try " << i;
  std::thread other([&] {
    for (int i = 0; i < 3; ++i) EXPECT_FALSE(GuardedCopy(tail.data(), gone, tail.size())) << "other thread, try " << i;
  });
  other.join();
  bool zero = false;
  auto test = [&] { zero = format::internal::AllZero(gone, 4096); };
  EXPECT_FALSE(Guarded(gone, 4096, test));
  EXPECT_TRUE(GuardedCopy(head.data(), m.data(), head.size()));
}

// --- deterministic: the file shrank after it was opened ---

TEST(FileRace, ShrunkAfterOpenFormatReadsAreIoErrors) {
  RaceSample sample;
  auto c = Container::Open(sample.path);
  const uint64_t size = c->file_bytes();
  Truncate(sample.path, size / 3);
  try {
    c->Verify();
    ADD_FAILURE() << "verified a file that lost two thirds of its bytes";
  } catch (const Error& e) {
    EXPECT_TRUE(Shrank(e, sample.path)) << e.what();
  }
  int shrank = 0;
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < c->chunk_count(); ++i) {
    buf.resize(c->chunk(i).raw_bytes);
    try {
      c->ReadChunk(i, buf.data(), true);
    } catch (const Error& e) {
      EXPECT_TRUE(Shrank(e, sample.path)) << e.what();
      ++shrank;
    }
  }
  EXPECT_GT(shrank, 0);
  auto blob = c->FindBlob("data.pkl");
  ASSERT_TRUE(blob.has_value());
  EXPECT_GT(blob->offset, size / 3);
  try {
    c->CheckedBlobBytes(*blob);
    ADD_FAILURE() << "read a blob past the end of the file";
  } catch (const Error& e) {
    EXPECT_TRUE(Shrank(e, sample.path)) << e.what();
  }
}

TEST(FileRace, ShrunkAfterOpenEveryReadMethodIsAnIoError) {
  for (int zstd : {0, 3}) {
    for (ReadMethod method : kMethods) {
      for (bool into : {true, false}) {
        SCOPED_TRACE(std::string(ReadMethodName(method)) + (into ? ", into destinations" : ", ring only") +
                     (zstd ? ", zstd" : ", raw"));
        RaceSample sample(zstd);
        auto c = Container::Open(sample.path);
        Target target;
        Destinations d = target.Plan(*c, false);
        Truncate(sample.path, c->file_bytes() / 2);
        LoadOptions o;
        o.method = method;
        o.cpu_read_into_destination = into;
        try {
          loader::StreamChunks(*c, d, o, {});
          ADD_FAILURE() << "loaded a file that lost half its bytes";
        } catch (const Error& e) {
          EXPECT_TRUE(Shrank(e, sample.path)) << e.what();
        }
      }
    }
  }
}

// In the middle of a load: one slot, so the readers wait for each delivery; the first delivery
// truncates the file, and every later read finds it shorter.
TEST(FileRace, ShrunkDuringLoadEveryReadMethodIsAnIoError) {
  for (ReadMethod method : kMethods) {
    SCOPED_TRACE(ReadMethodName(method));
    RaceSample sample;
    auto c = Container::Open(sample.path);
    Target target;
    Destinations d = target.Plan(*c, false);
    LoadOptions o;
    o.method = method;
    o.cpu_read_into_destination = false;
    o.slots = 1;
    o.threads = 2;
    o.slot_bytes = 128 << 10;
    int calls = 0;
    o.progress = [&](uint64_t, uint64_t) {
      if (calls++ == 0) Truncate(sample.path, 4096);
    };
    try {
      loader::StreamChunks(*c, d, o, {});
      ADD_FAILURE() << "a load went on past the truncation";
    } catch (const Error& e) {
      EXPECT_TRUE(Shrank(e, sample.path)) << e.what();
    }
    EXPECT_GE(calls, 1);
  }
}

TEST(FileRace, ShrunkDuringVerifyIsAnIoError) {
  for (unsigned threads : {1u, 2u}) {
    RaceSample sample;
    auto c = Container::Open(sample.path);
    VerifyOptions o;
    o.threads = threads;
    std::atomic<int> calls{0};
    o.progress = [&](uint64_t, uint64_t) {
      if (calls++ == 0) Truncate(sample.path, 4096);
    };
    try {
      c->Verify(o);
      ADD_FAILURE() << "verify went on past the truncation";
    } catch (const Error& e) {
      EXPECT_TRUE(Shrank(e, sample.path)) << e.what();
    }
  }
}

// --- races: a second thread changes the file while reads loop ---

// Runs `change(rng)` on another thread in a loop while `read()` loops on this one, for about
// `seconds` (and at least `min_reads` reads).
template <typename Change, typename Read>
void Race(double seconds, int min_reads, Change change, Read read) {
  std::atomic<bool> stop{false};
  std::thread changer([&] {
    std::mt19937_64 rng(7);
    while (!stop.load(std::memory_order_relaxed)) change(rng);
  });
  auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (int n = 0; n < min_reads || Clock::now() < end; ++n) read(n);
  stop = true;
  changer.join();
}

// A sample, its bytes, what a load of it delivers, and a descriptor to change it through.
struct RaceFile {
  RaceSample sample;
  std::vector<uint8_t> original = testing::ReadFileBytes(sample.path);
  std::vector<std::vector<uint8_t>> expected;
  int fd = ::open(sample.path.c_str(), O_WRONLY);
  RaceFile() {
    auto c = Container::Open(sample.path);
    Target t;
    t.Plan(*c, false);
    expected = t.expected;
  }
  ~RaceFile() { ::close(fd); }
};

// Another process rewrites bytes in place (garbage over a random range, then the original back):
// every load (each method) and every chunk read either delivers the original bytes exactly or
// fails with an error; verify reports or throws, never crashes.
TEST(FileRace, RewrittenInPlaceDeliversTheOriginalOrFails) {
  RaceFile f;
  ASSERT_GE(f.fd, 0);
  std::atomic<int> ok{0}, failed{0};
  Race(
      EnvDouble("ZCKPT_RACE_SECONDS", 2.0), 24,
      [&](std::mt19937_64& rng) {
        uint64_t at = rng() % f.original.size(), n = 1 + rng() % 8192;
        n = std::min<uint64_t>(n, f.original.size() - at);
        std::vector<uint8_t> junk(n);
        for (auto& b : junk) b = static_cast<uint8_t>(rng());
        (void)!::pwrite(f.fd, junk.data(), n, static_cast<off_t>(at));
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        (void)!::pwrite(f.fd, f.original.data() + at, n, static_cast<off_t>(at));
      },
      [&](int n) {
        try {
          auto c = Container::Open(f.sample.path);
          if (n % 3 == 2) {
            (void)c->Verify();  // reports or throws: either way nothing crashed
            return;
          }
          Target target;
          Destinations d(c->chunk_count());
          // The plan of the original file: this Container's index passed its checksum, so it is
          // the original index; the data may be anything by now.
          target.storages.assign(c->storage_count(), {});
          for (uint32_t s = 0; s < c->storage_count(); ++s) {
            StorageInfo si = c->storage(s);
            target.storages[s].assign(si.raw_bytes, 0xEE);
            for (uint64_t k = 0; k < si.chunk_count; ++k)
              d.Add(si.first_chunk + k, Piece{0, c->chunk(si.first_chunk + k).raw_bytes,
                                              target.storages[s].data() + k * c->superblock().chunk_bytes, -1, -1, 0});
          }
          d.Finish();
          LoadOptions o;
          o.method = kMethods[n % 3];
          o.cpu_read_into_destination = n % 2 == 0;
          loader::StreamChunks(*c, d, o, {});
          ok++;
          for (uint32_t s = 0; s < c->storage_count(); ++s)
            ASSERT_TRUE(target.storages[s] == f.expected[s]) << "storage " << s << " delivered bytes that were never checked";
        } catch (const Error& e) {
          EXPECT_TRUE(RaceKind(e.kind())) << e.what();
          failed++;
        }
      });
  // The race happened: some reads met a rewritten range (and some got through untouched).
  EXPECT_GT(failed.load(), 0);
  std::printf("rewrite race: %d loads delivered the original, %d stopped with an error\n", ok.load(), failed.load());
}

// Another process truncates the file and writes it back, again and again: loads (each method),
// chunk reads and verifications end in the original bytes or an error naming the file.
TEST(FileRace, TruncatedAndRestoredDeliversTheOriginalOrFails) {
  RaceFile f;
  ASSERT_GE(f.fd, 0);
  std::atomic<int> ok{0}, shrank{0}, failed{0};
  Race(
      EnvDouble("ZCKPT_RACE_SECONDS", 2.0), 24,
      [&](std::mt19937_64& rng) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        (void)!::ftruncate(f.fd, static_cast<off_t>(rng() % f.original.size()));
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1000));
        (void)!::pwrite(f.fd, f.original.data(), f.original.size(), 0);
      },
      [&](int n) {
        try {
          auto c = Container::Open(f.sample.path);
          if (n % 3 == 2) {
            (void)c->Verify();
            ok++;
            return;
          }
          Target target;
          Destinations d = target.Plan(*c, false);  // ReadChunk of every chunk: may throw too
          LoadOptions o;
          o.method = kMethods[n % 3];
          o.cpu_read_into_destination = n % 2 == 0;
          loader::StreamChunks(*c, d, o, {});
          ok++;
          for (uint32_t s = 0; s < c->storage_count(); ++s) ASSERT_TRUE(target.storages[s] == f.expected[s]) << "storage " << s;
        } catch (const Error& e) {
          EXPECT_TRUE(RaceKind(e.kind())) << e.what();
          if (Shrank(e, f.sample.path)) shrank++;
          else failed++;
        }
      });
  EXPECT_GT(shrank.load(), 0) << "no read ever met the truncation: the race did not happen";
  std::printf("truncation race: %d reads complete, %d met a shrunk file, %d other errors\n", ok.load(), shrank.load(),
              failed.load());
}

}  // namespace
}  // namespace zckpt::hardening
