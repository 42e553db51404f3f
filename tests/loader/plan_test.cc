// The batch plan's invariants, whatever the file: every needed chunk in exactly one batch, in
// order; slot batches fit a slot (O_DIRECT spans 4 KiB-aligned); small storages packed; chunks
// of large storages straight into host destinations only when one whole piece takes them.
#include <gtest/gtest.h>

#include "loader/plan.h"
#include "loader_test_util.h"
#include "test_util.h"
#include "zckpt/container.h"

namespace zckpt::loader {
namespace {

using testing::Fixture;

Fixture Mixed() {
  Fixture f;
  for (int i = 0; i < 500; ++i) f.AddContiguous(std::string("tiny").append(std::to_string(i)), DType::kUInt8, {1 + i}, i);
  f.AddContiguous("big", DType::kFloat32, {100000}, 1);
  f.AddStorage("z", testing::CompressibleBytes(100000, 1));
  f.AddTensor("z", f.storages().size() - 1, DType::kUInt8, {100000}, {1});
  for (int i = 0; i < 50; ++i) f.AddContiguous(std::string("more").append(std::to_string(i)), DType::kInt64, {100}, i);
  return f;
}

// One host piece per chunk (what Load builds), skipping every `skip`-th chunk (what LoadInto
// leaves when no target wants it).
Destinations AllChunks(const Container& c, std::vector<uint8_t>* memory, int skip = 0) {
  uint64_t total = 0;
  for (uint64_t i = 0; i < c.chunk_count(); ++i) total += c.chunk(i).raw_bytes;
  memory->assign(total, 0);
  Destinations d(c.chunk_count());
  uint64_t at = 0;
  for (uint64_t i = 0; i < c.chunk_count(); ++i) {
    Piece p;
    p.bytes = c.chunk(i).raw_bytes;
    p.dst = memory->data() + at;
    at += p.bytes;
    if (skip == 0 || i % skip != 0) d.Add(i, p);
  }
  d.Finish();
  return d;
}

void ExpectInvariants(const Container& c, const Destinations& d, const PlanOptions& o, const Plan& plan) {
  uint64_t next = 0, raw = 0;
  for (const Batch& b : plan.batches) {
    ASSERT_LE(next, b.first);
    for (uint64_t i = next; i < b.first; ++i) EXPECT_FALSE(d.needed(i)) << "chunk " << i << " in no batch";
    next = b.last;
    raw += b.raw_bytes;
    if (!b.in_slot) continue;
    if (o.align_spans && !b.zstd) {
      EXPECT_EQ(b.file_begin % kDirectIoAlign, 0u);
      EXPECT_EQ(b.file_end % kDirectIoAlign, 0u);
    }
    if (!b.zstd) {
      EXPECT_LE(b.file_end - b.file_begin, o.slot_capacity);
    }
    for (uint64_t i = b.first; i < b.last; ++i) {
      if (!d.needed(i)) continue;
      format::ChunkRecord r = c.chunk(i);
      EXPECT_EQ(IsZstd(r), b.zstd);
      EXPECT_LE(plan.slot_offset[i] + r.raw_bytes, o.slot_capacity) << "chunk " << i;
      if (!b.zstd) {
        EXPECT_EQ(plan.slot_offset[i], r.offset - b.file_begin);
      }
    }
  }
  for (uint64_t i = next; i < c.chunk_count(); ++i) EXPECT_FALSE(d.needed(i));
  EXPECT_EQ(raw, plan.raw_bytes);
}

TEST(Plan, InvariantsHoldForEveryOptionSet) {
  testing::TempDir dir;
  std::string path = Mixed().WriteIn(dir, "p.zckpt", testing::SmallChunks(4096, 3));
  auto c = Container::Open(path);
  std::vector<uint8_t> memory;
  for (int skip : {0, 3}) {
    Destinations d = AllChunks(*c, &memory, skip);
    for (bool align : {false, true}) {
      for (bool direct : {false, true}) {
        for (uint64_t slot : {4096u, 16384u, 65536u}) {
          PlanOptions o;
          o.slot_capacity = slot + 2 * kDirectIoAlign;
          o.batch_bytes = slot;
          o.align_spans = align;
          o.read_into_destination = direct;
          Plan plan = MakePlan(*c, d, o);
          SCOPED_TRACE("skip " + std::to_string(skip) + " align " + std::to_string(align) + " direct " +
                       std::to_string(direct) + " slot " + std::to_string(slot));
          ExpectInvariants(*c, d, o, plan);
          if (!direct) {
            EXPECT_EQ(plan.destination_chunks, 0u);
          }
        }
      }
    }
  }
}

TEST(Plan, SmallStoragesArePackedAndLargeOnesGoStraightIn) {
  testing::TempDir dir;
  std::string path = Mixed().WriteIn(dir, "p.zckpt", testing::SmallChunks(4096, 3));
  auto c = Container::Open(path);
  std::vector<uint8_t> memory;
  Destinations d = AllChunks(*c, &memory);
  PlanOptions o;
  o.slot_capacity = 65536 + 2 * kDirectIoAlign;
  o.batch_bytes = 65536;
  o.read_into_destination = true;
  Plan plan = MakePlan(*c, d, o);
  // 500 tiny storages (~125 KiB with padding) share a few slots.
  EXPECT_LE(plan.slot_batches, 10u);
  // "big" (400000 bytes, 98 chunks) and "z" (zstd, 25 chunks) go straight into their memory.
  EXPECT_EQ(plan.destination_chunks, 98u + 25u);
  // Two pieces in one chunk (a tied weight, a partial LoadInto target): back through a slot.
  Destinations two(c->chunk_count());
  uint64_t big_first = c->storage(500).first_chunk;
  for (uint64_t i = 0; i < c->chunk_count(); ++i) {
    for (const Piece& p : d.of(i)) {
      two.Add(i, p);
      if (i == big_first) two.Add(i, p);
    }
  }
  two.Finish();
  EXPECT_EQ(MakePlan(*c, two, o).destination_chunks, 98u + 25u - 1);
}

}  // namespace
}  // namespace zckpt::loader
