// What the torch-free pipeline tests load into: host buffers for every storage, the pieces that
// send each chunk there, and the bytes Container::ReadChunk gives (what a load must deliver).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hardening_util.h"
#include "loader/plan.h"
#include "test_util.h"
#include "zckpt/container.h"

namespace zckpt::hardening {

using loader::Destinations;
using loader::Piece;
using testing::TempDir;

// Host buffers for every storage and the pieces sending each chunk (whole, or split in two
// pieces going to two places) into them.
struct Target {
  std::vector<std::vector<uint8_t>> storages;
  std::vector<std::vector<uint8_t>> expected;

  Destinations Plan(const Container& c, bool split, uint32_t skip_every = 0) {
    storages.assign(c.storage_count(), {});
    expected.assign(c.storage_count(), {});
    Destinations d(c.chunk_count());
    const uint64_t chunk_bytes = c.superblock().chunk_bytes;
    for (uint32_t s = 0; s < c.storage_count(); ++s) {
      StorageInfo si = c.storage(s);
      storages[s].assign(si.raw_bytes, 0xEE);
      expected[s].assign(si.raw_bytes, 0xEE);
      if (skip_every && s % skip_every == 1) continue;  // a storage nobody asked for
      for (uint64_t k = 0; k < si.chunk_count; ++k) {
        uint64_t i = si.first_chunk + k;
        uint64_t raw = c.chunk(i).raw_bytes;
        uint8_t* dst = storages[s].data() + k * chunk_bytes;
        c.ReadChunk(i, expected[s].data() + k * chunk_bytes, true);
        if (split && raw > 1) {
          uint64_t half = raw / 2;
          d.Add(i, Piece{0, half, dst, -1, -1, 0});
          d.Add(i, Piece{half, raw - half, dst + half, -1, -1, 0});
        } else {
          d.Add(i, Piece{0, raw, dst, -1, -1, 0});
        }
      }
    }
    d.Finish();
    return d;
  }
};

struct Sample {
  TempDir dir;
  std::string path;
  explicit Sample(uint64_t chunk_bytes, int zstd = 3, uint64_t seed = 1, unsigned storages = 10,
                  uint64_t max_storage_bytes = 1 << 20)
      : path(dir.File("p.zckpt")) {
    WriteSampleContainer(path, seed, storages, max_storage_bytes, zstd, chunk_bytes);
  }
};

}  // namespace zckpt::hardening
