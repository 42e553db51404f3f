// TensorStream: every tensor record one at a time in table order, each a fresh contiguous tensor
// equal to Load's view of it; corrupt chunks found as streamed, or before the first tensor with
// verify_first.
#include <gtest/gtest.h>

#include "loader_test_util.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"
#include "zckpt/loader.h"
#include "zckpt/tensor_stream.h"

namespace zckpt {
namespace {

using testing::Fixture;

const c10::Device kCpu(c10::kCPU);

Fixture Model() {
  Fixture f;
  uint32_t flat = f.AddStorage("flat", testing::RandomBytes(4000 * 4, 1), DType::kFloat32);
  f.AddTensor("a", flat, DType::kFloat32, {100, 30}, {30, 1}, 0);
  f.AddTensor("at", flat, DType::kFloat32, {30, 100}, {1, 30}, 0);  // a transposed view: staged
  f.AddContiguous("big", DType::kBFloat16, {1024, 700}, 2);         // > 1 MiB: pages of its own
  f.AddContiguous("ids", DType::kInt64, {999}, 3);
  f.AddContiguous("scalar", DType::kFloat64, {}, 5);
  f.AddContiguous("empty", DType::kFloat32, {0, 3}, 6);
  return f;
}

TEST(TensorStream, EveryTensorInTableOrderAsLoadSeesIt) {
  testing::TempDir dir;
  Fixture f = Model();
  std::string path = f.WriteIn(dir, "m.zckpt");
  LoadResult want = Load(path, kCpu);
  TensorStream s(Container::Open(path), kCpu);
  EXPECT_EQ(s.remaining(), 6u);
  std::vector<std::string> names;
  std::string name;
  at::Tensor t;
  while (s.Next(&name, &t)) {
    names.push_back(name);
    EXPECT_TRUE(t.is_contiguous()) << name;
    EXPECT_EQ(t.storage_offset(), 0) << name;
    EXPECT_TRUE(testing::SameBytes(t, want.get(name))) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"a", "at", "big", "ids", "scalar", "empty"}));
  EXPECT_EQ(s.remaining(), 0u);
  EXPECT_FALSE(s.Next(&name, &t));
  EXPECT_EQ(s.stats().tensors, 6u);
}

uint64_t DamageStorageOf(const std::string& path, const std::string& tensor) {
  auto c = Container::Open(path);
  StorageInfo s = c->storage(c->tensor(*c->FindTensor(tensor)).storage);
  format::ChunkRecord r = c->chunk(s.first_chunk);
  testing::FlipBit(path, r.offset + r.stored_bytes / 2);
  return s.first_chunk;
}

TEST(TensorStream, CorruptChunkFoundWhenItsTensorIsStreamed) {
  testing::TempDir dir;
  std::string path = Model().WriteIn(dir, "m.zckpt");
  uint64_t chunk = DamageStorageOf(path, "ids");
  TensorStream s(Container::Open(path), kCpu);
  std::string name;
  at::Tensor t;
  std::vector<std::string> got;
  try {
    while (s.Next(&name, &t)) got.push_back(name);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("ids"), std::string::npos) << m;
    EXPECT_NE(m.find("chunk " + std::to_string(chunk)), std::string::npos) << m;
  }
  EXPECT_EQ(got, (std::vector<std::string>{"a", "at", "big"}));
}

TEST(TensorStream, VerifyFirstRefusesBeforeTheFirstTensor) {
  testing::TempDir dir;
  std::string path = Model().WriteIn(dir, "m.zckpt");
  DamageStorageOf(path, "scalar");
  TensorStreamOptions o;
  o.verify_first = true;
  try {
    TensorStream s(Container::Open(path), kCpu, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << m;
    EXPECT_NE(m.find("before the first tensor"), std::string::npos) << m;
    EXPECT_NE(m.find("scalar"), std::string::npos) << m;
    EXPECT_NE(m.find("file bytes ["), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace zckpt
