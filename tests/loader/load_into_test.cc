// LoadInto on CPU targets: in place (data_ptr unchanged), exact values, direct vs staged layouts,
// mismatches caught before any byte moves, strict/non-strict key handling.
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "loader_test_util.h"
#include "test_util.h"
#include "zckpt/error.h"
#include "zckpt/format.h"
#include "zckpt/load_regions.h"
#include "zckpt/loader.h"

namespace zckpt {
namespace {

using testing::Fixture;
using testing::SmallChunks;
using Targets = std::vector<std::pair<std::string, at::Tensor>>;

const c10::Device kCpu(c10::kCPU);

// A flat buffer (like an optimizer's) with contiguous views that start and end mid-chunk, a big
// tensor of its own, a transposed view and a conj view.
Fixture Model() {
  Fixture f;
  uint32_t flat = f.AddStorage("flat", testing::RandomBytes(40000 * 4, 1), DType::kFloat32);
  f.AddTensor("a", flat, DType::kFloat32, {100, 30}, {30, 1}, 0);      // [0, 12000)
  f.AddTensor("b", flat, DType::kFloat32, {2500}, {1}, 3001);          // [12004, 22004)
  f.AddTensor("c", flat, DType::kFloat32, {7, 11, 13}, {143, 13, 1}, 9000);
  f.AddTensor("at", flat, DType::kFloat32, {30, 100}, {1, 30}, 0);     // a transposed: staged
  f.AddContiguous("big", DType::kBFloat16, {300, 700}, 2);
  f.AddContiguous("ids", DType::kInt64, {999}, 3);
  uint32_t cx = f.AddStorage("cx", testing::RandomBytes(64 * 8, 4), DType::kComplex64);
  f.AddTensor("cx_conj", cx, DType::kComplex64, {8, 8}, {8, 1}, 0, format::kTensorConj);
  f.AddContiguous("scalar", DType::kFloat64, {}, 5);
  f.AddContiguous("empty", DType::kFloat32, {0, 3}, 6);
  return f;
}

Targets ZerosLike(const Fixture& f, const std::map<DType, c10::ScalarType>& types) {
  Targets t;
  for (const auto& nt : f.tensors()) t.emplace_back(nt.name, at::zeros(nt.shape, types.at(nt.dtype)));
  return t;
}

const std::map<DType, c10::ScalarType> kTypes = {{DType::kFloat32, at::kFloat}, {DType::kBFloat16, at::kBFloat16},
                                                 {DType::kInt64, at::kLong},    {DType::kComplex64, at::kComplexFloat},
                                                 {DType::kFloat64, at::kDouble}};

void ExpectLoadedValues(const std::string& path, const Targets& targets) {
  LoadResult want = Load(path, kCpu);
  for (const auto& [name, t] : targets) EXPECT_TRUE(testing::SameBytes(t, want.get(name))) << name;
}

class Into : public ::testing::TestWithParam<bool> {};

TEST_P(Into, CopiesInPlaceKeepingEveryDataPtr) {
  testing::TempDir dir;
  Fixture f = Model();
  std::string path = f.WriteIn(dir, "m.zckpt");
  Targets targets = ZerosLike(f, kTypes);
  // A non-contiguous target: staged, then copy_ lays it out.
  targets[5].second = at::zeros({999, 2}, at::kLong).select(1, 1);
  std::vector<void*> ptrs;
  for (const auto& t : targets) ptrs.push_back(t.second.data_ptr());
  LoadIntoOptions o;
  o.base.cpu_read_into_destination = GetParam();
  o.base.slot_bytes = 8192;
  o.base.slots = 3;
  o.base.threads = 3;
  LoadIntoReport r = LoadInto(path, targets, o);
  for (size_t i = 0; i < targets.size(); ++i) EXPECT_EQ(targets[i].second.data_ptr(), ptrs[i]) << targets[i].first;
  ExpectLoadedValues(path, targets);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.unexpected.empty());
  EXPECT_EQ(r.tensors_copied, targets.size());
  EXPECT_EQ(r.tensors_staged, 3u);  // "at" (transposed), "cx_conj" (conj bit), "ids" (strided target)
  EXPECT_EQ(r.tensors_direct, targets.size() - 3 - 1);  // "empty" moves nothing
  // Only chunks some target needs are read: of the flat storage's 40 chunks, the 8 under a..c.
  EXPECT_EQ(r.stats.raw_bytes, 8u * 4096 + 300 * 700 * 2 + 999 * 8 + 64 * 8 + 8);
}

INSTANTIATE_TEST_SUITE_P(Paths, Into, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "into_destination" : "through_ring"; });

TEST(LoadInto, MismatchesAreFoundBeforeAnyByteMoves) {
  testing::TempDir dir;
  Fixture f = Model();
  std::string path = f.WriteIn(dir, "m.zckpt");
  Targets targets = ZerosLike(f, kTypes);
  targets[0].second = at::full({100, 30}, 7.0, at::kFloat);      // "a": right, must stay untouched
  targets[4].second = at::full({300, 700}, 7.0, at::kFloat);     // "big": dtype differs
  targets[5].second = at::full({998}, 7, at::kLong);             // "ids": shape differs
  try {
    LoadInto(path, targets);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(m.find("dtype mismatch for 'big': the file has bfloat16, the target has float32"), std::string::npos) << m;
    EXPECT_NE(m.find("size mismatch for 'ids': the file has shape [999], the target has shape [998]"),
              std::string::npos)
        << m;
  }
  EXPECT_TRUE(at::equal(targets[0].second, at::full({100, 30}, 7.0, at::kFloat)));
  EXPECT_TRUE(at::equal(targets[5].second, at::full({998}, 7, at::kLong)));
}

TEST(LoadInto, StrictReportsMissingAndUnexpectedLikeLoadStateDict) {
  testing::TempDir dir;
  Fixture f = Model();
  std::string path = f.WriteIn(dir, "m.zckpt");
  Targets targets = ZerosLike(f, kTypes);
  targets.erase(targets.begin() + 1);                                    // "b" unexpected
  targets.emplace_back("not_in_file", at::full({3}, 7.0, at::kFloat));  // missing
  try {
    LoadInto(path, targets);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Missing key(s): \"not_in_file\"; Unexpected key(s): \"b\""),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(targets[0].second.abs().sum().item<float>(), 0.0f);  // nothing moved

  LoadIntoOptions lax;
  lax.strict = false;
  LoadIntoReport r = LoadInto(path, targets, lax);
  EXPECT_EQ(r.missing, std::vector<std::string>{"not_in_file"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"b"});
  EXPECT_TRUE(at::equal(targets.back().second, at::full({3}, 7.0, at::kFloat)));
  targets.pop_back();
  ExpectLoadedValues(path, targets);
}

TEST(LoadInto, BumpsVersionCountersAndWorksUnderLeafRequiresGrad) {
  testing::TempDir dir;
  Fixture f;
  f.AddContiguous("w", DType::kFloat32, {64, 64}, 1);
  uint32_t s = f.AddStorage("t", testing::RandomBytes(64 * 4, 2), DType::kFloat32);
  f.AddTensor("wt", s, DType::kFloat32, {8, 8}, {1, 8});
  std::string path = f.WriteIn(dir, "g.zckpt");
  at::Tensor w = at::zeros({64, 64}, at::kFloat);
  at::Tensor wt = at::zeros({8, 8}, at::kFloat);
  w.set_requires_grad(true);
  wt.set_requires_grad(true);  // staged: copy_ into a leaf needs no_grad, as load_state_dict does
  auto v0 = w._version();
  LoadInto(path, {{"w", w}, {"wt", wt}});
  EXPECT_GT(w._version(), v0);
  ExpectLoadedValues(path, {{"w", w.detach()}, {"wt", wt.detach()}});
}

// LoadRegions with element runs: runs of saved tensors into existing tensors (FSDP1's
// FlatParameter shards are filled this way from per-parameter shards).
TEST(LoadRegionsElementRuns, CopiesElementRunsStraightIntoTargets) {
  testing::TempDir dir;
  Fixture f = Model();
  std::string path = f.WriteIn(dir, "m.zckpt");
  LoadResult want = Load(path, kCpu);
  at::Tensor flat = at::zeros({100 + 2500 + 1000}, at::kFloat);  // one buffer, three runs in it
  at::Tensor big = at::zeros({3000}, at::kBFloat16);
  std::vector<Region> ranges = {
      ElementRun("a", 1000, flat.narrow(0, 0, 100)),                   // crosses a chunk boundary (4 KiB chunks)
      ElementRun("b", 0, flat.narrow(0, 100, 2500)),                   // the whole tensor
      ElementRun("c", 1, flat.narrow(0, 2600, 1000).view({2, 500})),  // the last 1000 of 1001; any target shape
      ElementRun("big", 100000, big),
  };
  void* ptr = flat.data_ptr();
  LoadRegionsReport r = LoadRegions(path, ranges);
  EXPECT_EQ(flat.data_ptr(), ptr);
  EXPECT_EQ(r.regions, 4u);
  auto part = [&](const char* name, int64_t begin, int64_t n) {
    return want.get(name).reshape(-1).narrow(0, begin, n).contiguous();
  };
  EXPECT_TRUE(testing::SameBytes(flat.narrow(0, 0, 100), part("a", 1000, 100)));
  EXPECT_TRUE(testing::SameBytes(flat.narrow(0, 100, 2500), part("b", 0, 2500)));
  EXPECT_TRUE(testing::SameBytes(flat.narrow(0, 2600, 1000), part("c", 1, 1000)));
  EXPECT_TRUE(testing::SameBytes(big, part("big", 100000, 3000)));
}

TEST(LoadRegionsElementRuns, EveryProblemIsFoundBeforeAnyByteMoves) {
  testing::TempDir dir;
  Fixture f = Model();
  std::string path = f.WriteIn(dir, "m.zckpt");
  at::Tensor untouched = at::full({10}, 7.0, at::kFloat);
  std::vector<Region> ranges = {
      ElementRun("a", 0, untouched),                                    // fine: must stay 7s
      ElementRun("a", 2995, at::zeros({6}, at::kFloat)),                // past the 3000 elements
      ElementRun("at", 0, at::zeros({10}, at::kFloat)),                 // transposed in its storage
      ElementRun("big", 0, at::zeros({10}, at::kFloat)),                // bfloat16 in the file
      ElementRun("nope", 0, at::zeros({1}, at::kFloat)),                // not in the file
      ElementRun("b", 0, at::zeros({10, 2}, at::kFloat).select(1, 0)),  // target not contiguous
  };
  try {
    LoadRegions(path, ranges);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("elements [2995, 3001) of 'a' are past its 3000 elements"), std::string::npos) << m;
    EXPECT_NE(m.find("'at' is not contiguous in its storage"), std::string::npos) << m;
    EXPECT_NE(m.find("dtype mismatch for 'big'"), std::string::npos) << m;
    EXPECT_NE(m.find("'nope' is not in the file"), std::string::npos) << m;
    EXPECT_NE(m.find("the target of 'b' is not contiguous"), std::string::npos) << m;
  }
  EXPECT_TRUE(at::equal(untouched, at::full({10}, 7.0, at::kFloat)));
}

}  // namespace
}  // namespace zckpt
