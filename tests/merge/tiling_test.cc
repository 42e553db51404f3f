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
