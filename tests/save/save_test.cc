// zckpt::Save (named tensors, pickled by LibTorch's pickler) and SavePickled: the container's
// records, round trips through zckpt::Load, refusals, atomicity, the CUDA path.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <csignal>

#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/loader.h"
#include "zckpt/memory_stats.h"
#include "zckpt/save.h"

namespace zckpt {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

Named Model() {
  at::manual_seed(1);
  at::Tensor w = at::randn({6, 4});
  return {{"layers.0.w", w},  {"tied", w}, {"w_t", w.t()}, {"row", w[2]},
          {"bf16", at::randn({5}).to(at::kBFloat16)}, {"step", at::scalar_tensor(7, at::kLong)},
          {"empty", at::zeros({0, 3}, at::kInt)}};
}

template <typename F>
ErrorKind KindOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no zckpt::Error thrown";
  return ErrorKind::kIo;
}

TEST(Save, RecordsAreTheTensorsAsNamed) {
  testing::TempDir dir;
  const std::string path = dir.File("m.zckpt");
  Named model = Model();
  SaveStats stats = Save(path, model, {{"step", "7"}});
  EXPECT_EQ(stats.tensors, model.size());
  EXPECT_EQ(stats.storages, 4u);  // w (with its views and tie), bf16, step, empty
  auto c = Container::Open(path);
  ASSERT_EQ(c->tensor_count(), model.size());
  for (uint32_t i = 0; i < c->tensor_count(); ++i) {
    TensorInfo t = c->tensor(i);
    const at::Tensor& want = model[i].second;
    EXPECT_EQ(t.name, model[i].first);
    EXPECT_EQ(t.shape, want.sizes().vec()) << t.name;
    EXPECT_EQ(t.stride, want.strides().vec()) << t.name;
    EXPECT_EQ(t.storage_offset, static_cast<uint64_t>(want.storage_offset())) << t.name;
  }
  // One storage under the tensor, its tie and its views.
  for (const char* name : {"tied", "w_t", "row"}) EXPECT_EQ(c->tensor(*c->FindTensor(name)).storage, 0u) << name;
  EXPECT_EQ(c->FindMetadata("step"), "7");
  EXPECT_EQ(c->FindMetadata("zckpt.source.format"), "zip");
  EXPECT_EQ(c->FindMetadata("zckpt.source.prefix"), "m");  // torch.save(obj, "m.zckpt") would say so
  for (const char* blob : {"data.pkl", ".format_version", ".storage_alignment", "byteorder", "version",
                           ".data/serialization_id"})
    EXPECT_TRUE(c->FindBlob(blob)) << blob;
  EXPECT_TRUE(c->Verify().ok());
}

TEST(Save, LoadGivesTheTensorsBackSharingAsSaved) {
  testing::TempDir dir;
  const std::string path = dir.File("m.zckpt");
  Named model = Model();
  Save(path, model);
  LoadResult r = Load(path, c10::Device(c10::kCPU));
  for (const auto& [name, t] : model) {
    at::Tensor got = r.get(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(got, t)) << name;
  }
  EXPECT_EQ(r.get("tied").data_ptr(), r.get("layers.0.w").data_ptr());
  EXPECT_EQ(r.get("row").storage().data_ptr().get(), r.get("layers.0.w").storage().data_ptr().get());
  // The object tree: the dict {name: tensor} in the order given.
  ASSERT_TRUE(r.tree.isGenericDict());
  std::vector<std::string> keys;
  for (const auto& entry : r.tree.toGenericDict()) keys.push_back(entry.key().toStringRef());
  std::vector<std::string> names;
  for (const auto& [name, t] : model) names.push_back(name);
  EXPECT_EQ(keys, names);
}

TEST(Save, OptionsReachTheWriter) {
  testing::TempDir dir;
  const std::string path = dir.File("z.zckpt");
  SaveOptions o;
  o.writer.chunk_bytes = 64 << 10;
  o.writer.zstd_level = 3;
  o.writer.threads = 2;
  SaveStats s = Save(path, {{"zeros", at::zeros({64 << 10})}}, {}, o);
  EXPECT_EQ(s.written.chunks, 4u);  // 256 KiB in 64 KiB chunks
  EXPECT_EQ(s.written.compressed_chunks, 4u);
  EXPECT_LT(s.written.file_bytes, 64u << 10);  // each zeroed chunk shrinks to a 4 KiB-aligned slot
  EXPECT_TRUE(at::equal(Load(path, c10::Device(c10::kCPU)).get("zeros"), at::zeros({64 << 10})));
}

TEST(Save, Refusals) {
  testing::TempDir dir;
  const std::string path = dir.File("bad.zckpt");
  at::Tensor t = at::arange(4, at::kFloat);
  EXPECT_EQ(KindOf([&] { Save(path, {{"a", t}, {"a", t}}); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([&] { Save(path, {{"f", t}, {"i", t.view(at::kInt)}}); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([&] { Save(path, {{"s", at::eye(3).to_sparse()}}); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([&] { Save(path, {{"u", at::Tensor()}}); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([&] { Save(path, {{"a", t}}, {{"zckpt.x", "1"}}); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([&] { Save(dir.File("no/such/dir.zckpt"), {{"a", t}}); }), ErrorKind::kIo);
  EXPECT_TRUE(testing::ListDir(dir.path()).empty());
}

// A pickle of {"w": tensor} as torch pickles it, and its one storage "0".
PickledCheckpoint OneTensor(const at::Tensor& w) {
  PickledCheckpoint c;
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("w", w);
  torch::jit::Pickler p([&](const char* d, size_t n) { c.pickle.append(d, n); }, nullptr, nullptr, nullptr, nullptr,
                        false);
  p.protocol();
  p.pushIValue(dict);
  p.stop();
  c.storages["0"] = at::empty({0}, at::kByte).set_(w.storage(), 0, {static_cast<int64_t>(w.storage().nbytes())}, {1});
  return c;
}

TEST(SavePickled, StoragesMustMatchThePickle) {
  testing::TempDir dir;
  const std::string path = dir.File("p.zckpt");
  at::Tensor w = at::arange(10, at::kFloat);
  PickledCheckpoint good = OneTensor(w);
  SavePickled(path, good);
  EXPECT_TRUE(at::equal(Load(path, c10::Device(c10::kCPU)).get("w"), w));

  PickledCheckpoint missing = good;
  missing.storages.clear();
  PickledCheckpoint extra = good;
  extra.storages["1"] = at::zeros({4}, at::kByte);
  PickledCheckpoint short_one = good;
  short_one.storages["0"] = short_one.storages["0"].slice(0, 0, 8);
  PickledCheckpoint wrong_dtype = good;
  wrong_dtype.storages["0"] = w;
  for (const PickledCheckpoint* c : {&missing, &extra, &short_one, &wrong_dtype})
    EXPECT_EQ(KindOf([&] { SavePickled(dir.File("x.zckpt"), *c); }), ErrorKind::kInvalidArgument);
  PickledCheckpoint garbage = good;
  garbage.pickle = "not a pickle";
  EXPECT_EQ(KindOf([&] { SavePickled(dir.File("x.zckpt"), garbage); }), ErrorKind::kCorrupt);
  EXPECT_EQ(testing::ListDir(dir.path()), std::vector<std::string>{"p.zckpt"});
}

// A write failing half-way (the file size limit makes write(2) fail with EFBIG at 1 MiB): an
// error naming the file, the previous file untouched, no temporary left.
TEST(Save, FailedWriteLeavesTheOldFile) {
  testing::TempDir dir;
  const std::string path = dir.File("ckpt.zckpt");
  Save(path, {{"old", at::arange(10)}});
  std::vector<uint8_t> before = testing::ReadFileBytes(path);
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  ErrorKind kind = KindOf([&] {
    try {
      Save(path, {{"big", at::ones({4 << 20}, at::kByte)}});
    } catch (const Error& e) {
      message = e.what();
      throw;
    }
  });
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(kind, ErrorKind::kIo);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_EQ(testing::ListDir(dir.path()), std::vector<std::string>{"ckpt.zckpt"});
  EXPECT_EQ(testing::ReadFileBytes(path), before);
}

TEST(SaveCuda, StoragesStreamThroughTheRing) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount says none, or no CUDA build)";
  testing::TempDir dir;
  const std::string path = dir.File("cuda.zckpt");
  at::manual_seed(2);
  at::Tensor big = at::randn({3 << 20}, at::TensorOptions().device(at::kCUDA));  // 12 MiB: laps a 4 x 1 MiB ring
  SaveOptions o;
  o.cuda_slots = 4;
  o.cuda_slot_bytes = 1 << 20;
  SaveStats s = Save(path, {{"big", big}, {"view", big.slice(0, 5, 50)}, {"cpu", at::ones({3})}}, {}, o);
  EXPECT_EQ(s.cuda_bytes, uint64_t{12} << 20);
  EXPECT_EQ(s.cuda_ring_bytes, uint64_t{4} << 20);
  LoadResult r = Load(path, c10::Device(c10::kCPU));
  EXPECT_TRUE(at::equal(r.get("big"), big.cpu()));
  EXPECT_TRUE(at::equal(r.get("view"), big.slice(0, 5, 50).cpu()));
  auto c = Container::Open(path);
  EXPECT_EQ(c->storage(c->tensor(*c->FindTensor("big")).storage).location, "cuda:0");
}

}  // namespace
}  // namespace zckpt
