// The loader's streaming pipeline without LibTorch: ring, plan, chunk readers, the CPU copy
// engine and the reader threads (src/loader/{ring,plan,chunk_reader,pipeline,stream,
// copy_engine_cpu}.cc), driven directly with host destinations. Built from those sources in every
// build (they include no torch), so ThreadSanitizer can watch the reader threads, the ring and
// the stop path (tools/ci/sanitize.sh): LibTorch itself is not TSan-instrumented.
//
// Every load must deliver exactly the bytes Container::ReadChunk gives, with any number of
// reader threads, slots and read methods, concurrently from several threads; a cancelled load and
// a load hitting a corrupt chunk must stop with the right error, joining every thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
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
              o.threads = threads;
              o.slots = slots;
              if (chunk_bytes == 4096) o.slot_bytes = 64 << 10;  // else unset: the default
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

// Bytes not in the page cache go with O_DIRECT straight into page-aligned destinations, several
// reads in flight per reader thread (std::async), each chunk hashed as it lands: the same bytes
// as ReadChunk gives, from 1 or 4 readers, and a file half cached mixes both ways.
TEST(LoaderPipeline, UncachedBytesComeDirectIntoAlignedDestinations) {
  // ~40 MiB: larger than the readahead that reading the index at open does (up to 8 MiB here).
  TempDir dir;
  struct {
    std::string path;
  } sample{dir.File("cold.zckpt")};
  WriteSampleContainer(sample.path, 7, 24, 3 << 20, /*zstd_level=*/0, 1 << 20);
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  for (unsigned threads : {1u, 4u}) {
    for (bool half : {false, true}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + (half ? ", half cached" : ", cold"));
      std::vector<std::unique_ptr<uint8_t, Free>> storages;
      std::vector<std::vector<uint8_t>> expected;
      uint64_t chunks = 0, mid = 0;
      std::vector<std::pair<uint64_t, Piece>> pieces;
      {
        // The expected bytes through another Container, closed before the eviction: pages
        // mapped by a live mapping cannot be evicted.
        auto ref = Container::Open(sample.path);
        chunks = ref->chunk_count();
        mid = half ? ref->storage(ref->storage_count() / 2).data_offset : 0;
        for (uint32_t s = 0; s < ref->storage_count(); ++s) {
          StorageInfo si = ref->storage(s);
          void* p = nullptr;
          ASSERT_EQ(posix_memalign(&p, 4096, std::max<uint64_t>(si.raw_bytes, 1)), 0);
          storages.emplace_back(static_cast<uint8_t*>(p));
          std::memset(p, 0xEE, si.raw_bytes);
          expected.emplace_back(si.raw_bytes);
          for (uint64_t k = 0; k < si.chunk_count; ++k) {
            uint64_t i = si.first_chunk + k, off = k * ref->superblock().chunk_bytes;
            ref->ReadChunk(i, expected[s].data() + off, true);
            pieces.push_back({i, Piece{0, ref->chunk(i).raw_bytes, storages[s].get() + off, -1, -1, 0}});
          }
        }
      }
      bool direct = testing::EvictFromPageCache(sample.path, 0, mid);
      auto c = Container::Open(sample.path);
      Destinations d(chunks, std::move(pieces));
      LoadOptions o;
      o.threads = threads;
      LoadStats st = loader::StreamChunks(*c, d, o, {});
      for (size_t s = 0; s < expected.size(); ++s)
        ASSERT_TRUE(std::equal(expected[s].begin(), expected[s].end(), storages[s].get())) << "storage " << s;
      if (direct) {
        EXPECT_GT(st.uncached_bytes, 0u);
        if (half) EXPECT_LT(st.uncached_bytes, st.raw_bytes);
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
        o.threads = 1 + (t % 3);
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
    o.threads = 3;
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
      o.threads = threads;
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
