// The loader's streaming pipeline without LibTorch: ring, plan, chunk readers, the CPU copy
// engine and the reader threads (src/loader/{ring,plan,chunk_reader,pipeline,stream,
// copy_engine_cpu}.cc), driven directly with host destinations. Built from those sources in every
// build (they include no torch), so ThreadSanitizer can watch the reader threads, the ring and
// the stop path (tools/sanitize.sh): LibTorch itself is not TSan-instrumented.
//
// Every load must deliver exactly the bytes Container::ReadChunk gives, with any number of
// reader threads, slots and read methods, concurrently from several threads; a cancelled load and
// a load hitting a corrupt chunk must stop with the right error, joining every thread.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hardening_util.h"
#include "loader/plan.h"
#include "pipeline_target.h"
#include "loader/stream.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/load_options.h"

namespace zckpt::hardening {
namespace {

TEST(LoaderPipeline, DeliversExactlyWhatReadChunkGives) {
  for (uint64_t chunk_bytes : {uint64_t{4096}, uint64_t{1} << 20}) {
    Sample sample(chunk_bytes);
    auto c = Container::Open(sample.path);
    for (ReadMethod method : {ReadMethod::kPread, ReadMethod::kMmap, ReadMethod::kDirect}) {
      for (unsigned threads : {1u, 4u}) {
        for (unsigned slots : {1u, 3u}) {
          for (bool split : {false, true}) {
            for (bool into : {true, false}) {
              SCOPED_TRACE(std::string("chunk_bytes ") + std::to_string(chunk_bytes) + ", method " + ReadMethodName(method) +
                           ", threads " + std::to_string(threads) + ", slots " + std::to_string(slots) +
                           (split ? ", split pieces" : "") + (into ? ", read into destination" : ""));
              Target target;
              Destinations d = target.Plan(*c, split, split ? 3 : 0);
              LoadOptions o;
              o.method = method;
              o.reader_threads = threads;
              o.slots = slots;
              o.slot_bytes = chunk_bytes == 4096 ? 64 << 10 : 0;
              o.cpu_read_into_destination = into;
              uint64_t last = 0;
              bool monotonic = true;
              o.progress = [&](uint64_t done, uint64_t) {
                monotonic = monotonic && done >= last;
                last = done;
              };
              LoadStats st = loader::StreamChunks(*c, d, o, {});
              EXPECT_TRUE(monotonic);
              EXPECT_EQ(last, st.raw_bytes);
              for (uint32_t s = 0; s < c->storage_count(); ++s)
                ASSERT_TRUE(target.storages[s] == target.expected[s]) << "storage " << s;
            }
          }
        }
      }
    }
  }
}

TEST(LoaderPipeline, ConcurrentLoadsOfOneContainer) {
  Sample sample(64 << 10);
  auto c = Container::Open(sample.path);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 4; ++round) {
        Target target;
        Destinations d = target.Plan(*c, (t + round) % 2 == 1);
        LoadOptions o;
        o.reader_threads = 1 + (t % 3);
        o.slots = 1 + (round % 3);
        o.method = t % 3 == 0 ? ReadMethod::kMmap : ReadMethod::kPread;
        try {
          loader::StreamChunks(*c, d, o, {});
          for (uint32_t s = 0; s < c->storage_count(); ++s)
            if (target.storages[s] != target.expected[s]) bad++;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "thread %d: %s\n", t, e.what());
          bad++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(LoaderPipeline, CancelStopsEveryThread) {
  Sample sample(4096, 3);
  auto c = Container::Open(sample.path);
  for (int delay_us : {0, 50, 200, 1000, 5000}) {
    Target target;
    Destinations d = target.Plan(*c, false);
    std::atomic<bool> cancel{delay_us == 0};
    LoadOptions o;
    o.reader_threads = 3;
    o.slots = 2;
    o.slot_bytes = 16 << 10;
    o.cancel = &cancel;
    CancelAfter canceller(cancel, delay_us);
    try {
      loader::StreamChunks(*c, d, o, {});
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCancelled) << e.what();
    }
  }
}

TEST(LoaderPipeline, CorruptChunkStopsWithItsName) {
  Sample sample(4096, 0);
  const std::string bad_path = sample.dir.File("bad.zckpt");
  uint64_t victim = CopyWithCorruptMiddleChunk(sample.path, bad_path);
  auto c = Container::Open(bad_path);
  for (ReadMethod method : {ReadMethod::kPread, ReadMethod::kMmap, ReadMethod::kDirect}) {
    for (unsigned threads : {1u, 4u}) {
      Target target;
      Destinations d = target.Plan(*Container::Open(sample.path), false);
      LoadOptions o;
      o.reader_threads = threads;
      o.slots = 2;
      o.method = method;
      try {
        loader::StreamChunks(*c, d, o, {});
        ADD_FAILURE() << "a corrupt chunk went unnoticed (" << ReadMethodName(method) << ")";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
        EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(victim)), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace zckpt::hardening
