// merge::Tile and merge::Assembler on pieces held in memory: exact tiling is required before a
// byte is read, and every layout of piece lands where it belongs.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "merge/assemble.h"
#include "zckpt/error.h"

namespace zckpt::merge {
namespace {

// A piece over `data`: a row-major view of `shape` (or the given strides) placed at `offsets`.
Piece Make(const std::vector<float>& data, std::vector<int64_t> shape, std::vector<int64_t> offsets,
           std::vector<int64_t> stride = {}) {
  Piece p;
  p.view.what = "piece";
  p.view.bytes = reinterpret_cast<const uint8_t*>(data.data());
  p.view.bytes_size = data.size() * sizeof(float);
  p.view.dtype = DType::kFloat32;
  p.view.shape = shape;
  if (stride.empty()) {
    stride.assign(shape.size(), 1);
    for (size_t i = shape.size(); i-- > 1;) stride[i - 1] = stride[i] * shape[i];
  }
  p.view.stride = stride;
  p.offsets = offsets;
  return p;
}

// The values of the full tensor: element i holds i.
std::vector<float> Iota(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

// The box [offsets, offsets+sizes) of a row-major `full` tensor, row-major.
std::vector<float> BoxOf(const std::vector<int64_t>& full, const std::vector<int64_t>& offsets,
                         const std::vector<int64_t>& sizes) {
  std::vector<float> out;
  std::vector<int64_t> idx(sizes.size(), 0);
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  for (int64_t e = 0; e < n; ++e) {
    int64_t flat = 0;
    for (size_t d = 0; d < sizes.size(); ++d) flat = flat * full[d] + offsets[d] + idx[d];
    out.push_back(static_cast<float>(flat));
    for (size_t d = sizes.size(); d-- > 0;) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<float> Merge(FullTensor t) {
  Tile(t);
  std::vector<float> out(t.bytes() / sizeof(float), -1.0f);
  Assembler a;
  a.Assemble(t, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

void ExpectRefused(FullTensor t, const std::string& why) {
  try {
    Tile(t);
    FAIL() << "accepted; expected: " << why;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(Tiling, UnevenShardsAlongEachDimensionAndBlocks) {
  struct Case {
    std::vector<int64_t> full;
    std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> boxes;  // offsets, sizes
  };
  std::vector<Case> cases = {
      {{5, 3}, {{{0, 0}, {2, 3}}, {{2, 0}, {2, 3}}, {{4, 0}, {1, 3}}}},          // Shard(0), torch.chunk sizes
      {{2, 5}, {{{0, 0}, {2, 3}}, {{0, 3}, {2, 2}}}},                            // Shard(1)
      {{4, 6}, {{{0, 0}, {2, 3}}, {{0, 3}, {2, 3}}, {{2, 0}, {2, 3}}, {{2, 3}, {2, 3}}}},  // a 2x2 grid
      {{3, 2, 4}, {{{0, 0, 0}, {3, 1, 4}}, {{0, 1, 0}, {3, 1, 2}}, {{0, 1, 2}, {3, 1, 2}}}},
      {{7}, {{{0}, {4}}, {{4}, {3}}, {{7}, {0}}}},                               // an empty last shard
  };
  for (const Case& c : cases) {
    std::vector<std::vector<float>> store;
    store.reserve(c.boxes.size());
    FullTensor t{"t", DType::kFloat32, c.full, {}};
    for (const auto& [off, size] : c.boxes) {
      store.push_back(BoxOf(c.full, off, size));
      t.pieces.push_back(Make(store.back(), size, off));
    }
    int64_t n = 1;
    for (int64_t s : c.full) n *= s;
    EXPECT_EQ(Merge(t), Iota(static_cast<size_t>(n)));
  }
}

TEST(Tiling, ReplicasAreKeptOnceAndStridedPiecesLandRight) {
  std::vector<float> top = BoxOf({4, 3}, {0, 0}, {2, 3}), copy = top;
  // The bottom half saved transposed: storage holds it column-major, the view strides (1, 2).
  std::vector<float> bottom = BoxOf({4, 3}, {2, 0}, {2, 3}), bottom_t(6);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c) bottom_t[c * 2 + r] = bottom[r * 3 + c];
  FullTensor t{"t", DType::kFloat32, {4, 3}, {}};
  t.pieces = {Make(top, {2, 3}, {0, 0}), Make(copy, {2, 3}, {0, 0}), Make(bottom_t, {2, 3}, {2, 0}, {1, 2})};
  EXPECT_EQ(Merge(t), Iota(12));
}

TEST(Tiling, ReplicasThatDifferAreRefusedNamingBothAndNothingIsWritten) {
  // Two ranks' plain tensors of one name (FSDP1's flat optimizer moments read as if replicated):
  // same box, other bytes. Neither a tiling nor equal replicas: an error, never one of them.
  std::vector<float> a = Iota(6), b = Iota(6);
  b[4] = 99.0f;
  FullTensor t{"state.0.exp_avg", DType::kFloat32, {6}, {Make(a, {6}, {0}), Make(b, {6}, {0})}};
  t.pieces[0].view.what = "rank0.pt: tensor 'state.0.exp_avg'";
  t.pieces[1].view.what = "rank1.pt: tensor 'state.0.exp_avg'";
  Tile(t);
  ASSERT_EQ(t.pieces.size(), 1u);
  ASSERT_EQ(t.pieces[0].replicas.size(), 1u);
  std::vector<float> out(6, -1.0f);
  Assembler asm_;
  try {
    asm_.Assemble(t, reinterpret_cast<uint8_t*>(out.data()));
    FAIL() << "differing replicas accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    std::string msg = e.what();
    for (const char* needle : {"rank0.pt", "rank1.pt", "state.0.exp_avg", "element 4", "neither tile"})
      EXPECT_NE(msg.find(needle), std::string::npos) << needle << " not in: " << msg;
  }
  EXPECT_EQ(out, std::vector<float>(6, -1.0f));
  // Equal replicas of a box next to another piece: assembled once, in place.
  std::vector<float> top = BoxOf({3, 2}, {0, 0}, {2, 2}), top2 = top, rest = BoxOf({3, 2}, {2, 0}, {1, 2});
  FullTensor u{"u", DType::kFloat32, {3, 2}, {Make(top, {2, 2}, {0, 0}), Make(rest, {1, 2}, {2, 0}), Make(top2, {2, 2}, {0, 0})}};
  EXPECT_EQ(Merge(u), Iota(6));
}

TEST(Tiling, RunsOfAFlattenedTensorTileItsNumel) {
  // FSDP1 flat shards: a [3, 4] parameter at flat offset 2, ranks of 5 elements each: rank 0 holds
  // its elements [0, 3), rank 1 [3, 8), rank 2 [8, 12); each piece a 1-D run.
  std::vector<float> full = Iota(12);
  std::vector<float> r0(full.begin(), full.begin() + 3), r1(full.begin() + 3, full.begin() + 8),
      r2(full.begin() + 8, full.end());
  FullTensor t{"state.w.exp_avg", DType::kFloat32, {3, 4}, {Make(r2, {4}, {8}), Make(r0, {3}, {0}), Make(r1, {5}, {3})}, {12}};
  EXPECT_EQ(Merge(t), full);
  FullTensor gap{"state.w.exp_avg", DType::kFloat32, {3, 4}, {Make(r0, {3}, {0}), Make(r1, {5}, {3})}, {12}};
  ExpectRefused(gap, "cover 8 of its 12");
}

TEST(Tiling, ZeroDimTensor) {
  std::vector<float> v = {42.0f};
  FullTensor t{"step", DType::kFloat32, {}, {Make(v, {}, {})}};
  EXPECT_EQ(Merge(t), v);
}

TEST(Tiling, RefusesGapsOverlapsOutsidePiecesAndMixedDtypes) {
  std::vector<float> a = BoxOf({4, 2}, {0, 0}, {2, 2}), b = BoxOf({4, 2}, {1, 0}, {2, 2});
  ExpectRefused(FullTensor{"t", DType::kFloat32, {4, 2}, {Make(a, {2, 2}, {0, 0})}}, "cover 4 of its 8");
  ExpectRefused(FullTensor{"t", DType::kFloat32, {4, 2}, {Make(a, {2, 2}, {0, 0}), Make(b, {2, 2}, {1, 0})}},
                "overlaps");
  ExpectRefused(FullTensor{"t", DType::kFloat32, {4, 2}, {Make(a, {2, 2}, {3, 0})}}, "outside");
  Piece wrong = Make(a, {2, 2}, {2, 0});
  wrong.view.dtype = DType::kInt32;
  ExpectRefused(FullTensor{"t", DType::kFloat32, {4, 2}, {Make(a, {2, 2}, {0, 0}), wrong}}, "int32");
}

TEST(Tiling, FileBytesFailingTheirCrcAreRefused) {
  std::vector<float> v = Iota(4);
  FullTensor t{"t", DType::kFloat32, {4}, {Make(v, {4}, {0})}};
  t.pieces[0].view.crc32 = 0x12345678;  // not the bytes' CRC-32
  Tile(t);
  std::vector<float> out(4);
  Assembler a;
  try {
    a.Assemble(t, reinterpret_cast<uint8_t*>(out.data()));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("CRC-32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zckpt::merge
