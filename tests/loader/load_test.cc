// Load / LoadStorages on the CPU path: round trips against the bytes written, views and
// aliasing, compressed chunks, the ring (tiny slots, wrap-around, packing, many readers), every
// read method, progress, options.
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <gtest/gtest.h>

#include <iostream>
#include <tuple>

#include "loader/tensors.h"
#include "loader_test_util.h"
#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"
#include "zckpt/loader.h"

namespace zckpt {
namespace {

using testing::Fixture;
using testing::RandomBytes;
using testing::SmallChunks;

const c10::Device kCpu(c10::kCPU);

// Every tensor of `r` views its storage as the fixture says, and every storage holds exactly the
// bytes written.
void ExpectMatches(const Fixture& f, const TensorSet& r) {
  ASSERT_EQ(r.storages_by_key.size(), f.storages().size());
  for (const auto& s : f.storages()) {
    const at::Tensor& b = r.storages_by_key.at(s.key);
    EXPECT_EQ(b.scalar_type(), at::kByte);
    EXPECT_EQ(b.dim(), 1);
    EXPECT_TRUE(testing::BytesOf(b) == f.bytes(s.key)) << "storage " << s.key;
  }
  ASSERT_EQ(r.tensors.size(), f.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const NewTensor& want = f.tensors()[i];
    const auto& [name, t] = r.tensors[i];
    EXPECT_EQ(name, want.name);
    EXPECT_EQ(t.element_size(), DTypeSize(want.dtype)) << name;
    EXPECT_EQ(t.sizes(), c10::IntArrayRef(want.shape)) << name;
    EXPECT_EQ(t.strides(), c10::IntArrayRef(want.stride)) << name;
    EXPECT_EQ(t.storage_offset(), static_cast<int64_t>(want.storage_offset)) << name;
    const at::Tensor& storage = r.storages_by_key.at(f.key_of(want));
    // Same memory as the storage (aliasing), at the right place.
    EXPECT_EQ(t.storage().data_ptr().get(), storage.storage().data_ptr().get()) << name;
    EXPECT_EQ(r.get(name).unsafeGetTensorImpl(), t.unsafeGetTensorImpl());
    EXPECT_EQ(r.meta[i].storage_key, f.key_of(want));
  }
}

TEST(Load, EveryDtypeRoundTrips) {
  testing::TempDir dir;
  Fixture f;
  std::string lacking;
  for (uint16_t code = 1; code <= kMaxDTypeCode; ++code) {
    auto d = static_cast<DType>(code);
    if (d >= DType::kQInt8 && d <= DType::kQUInt2x4) continue;  // quantized: see QuantizedIsRefused
    try {
      (void)loader::ToScalarType(d, "probe");
    } catch (const Error&) {  // a dtype of a later torch (bcomplex32 before 2.15): DtypeThisTorchLacksIsRefused
      lacking += std::string(lacking.empty() ? "" : ", ") + std::string(DTypeName(d));
      continue;
    }
    f.AddContiguous(std::string(DTypeName(d)), d, {3, 5}, code);
  }
  if (!lacking.empty()) std::cout << "this torch lacks " << lacking << ": not round-tripped\n";
  f.AddContiguous("scalar", DType::kFloat32, {}, 99);
  f.AddContiguous("empty", DType::kBFloat16, {0, 7}, 100);
  std::string path = f.WriteIn(dir, "all.zckpt");
  LoadResult r = Load(path, kCpu);
  ExpectMatches(f, r);
  EXPECT_EQ(r.get("bfloat16").scalar_type(), at::kBFloat16);
  EXPECT_EQ(r.get("float8_e4m3fn").scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(r.get("float8_e5m2").scalar_type(), at::kFloat8_e5m2);
  EXPECT_EQ(r.get("complex64").scalar_type(), at::kComplexFloat);
  EXPECT_EQ(r.get("complex32").scalar_type(), at::kComplexHalf);
  EXPECT_EQ(r.get("bool").scalar_type(), at::kBool);
  EXPECT_EQ(r.get("uint16").scalar_type(), at::kUInt16);
  EXPECT_EQ(r.get("scalar").dim(), 0);
  EXPECT_EQ(r.get("empty").numel(), 0);
  // Values, not just bytes, for one dtype torch computes on.
  std::vector<uint8_t> raw = f.bytes("sfloat32");
  at::Tensor want = at::from_blob(raw.data(), {3, 5}, at::kFloat);
  EXPECT_TRUE(at::equal(r.get("float32"), want));
  EXPECT_EQ(r.stats.tensors, f.tensors().size());
  EXPECT_TRUE(r.stats.verified);
  EXPECT_THROW(r.get("nope"), Error);
}

TEST(Load, ViewsShareTheirStorage) {
  testing::TempDir dir;
  Fixture f;
  std::vector<uint8_t> raw = RandomBytes(100 * 4, 7);
  uint32_t s = f.AddStorage("flat", raw, DType::kFloat32);
  f.AddTensor("full", s, DType::kFloat32, {10, 10}, {10, 1});
  f.AddTensor("transposed", s, DType::kFloat32, {10, 10}, {1, 10});
  f.AddTensor("strided", s, DType::kFloat32, {5}, {3}, 17);
  f.AddTensor("zero_dim", s, DType::kFloat32, {}, {}, 42);
  f.AddTensor("empty", s, DType::kFloat32, {0, 4}, {4, 1}, 3);
  f.AddTensor("as_int", s, DType::kInt32, {4}, {1}, 96);  // another dtype over the same bytes
  f.AddTensor("flag", s, DType::kFloat32, {2}, {1}, 0, format::kTensorRequiresGrad | format::kTensorParameter);
  std::string path = f.WriteIn(dir, "views.zckpt");
  LoadResult r = Load(path, kCpu);
  ExpectMatches(f, r);

  at::Tensor base = at::from_blob(raw.data(), {100}, at::kFloat);
  EXPECT_TRUE(at::equal(r.get("full"), base.as_strided({10, 10}, {10, 1})));
  EXPECT_TRUE(at::equal(r.get("transposed"), base.as_strided({10, 10}, {1, 10})));
  EXPECT_TRUE(at::equal(r.get("strided"), base.as_strided({5}, {3}, 17)));
  EXPECT_TRUE(at::equal(r.get("zero_dim"), base.as_strided({}, {}, 42)));
  EXPECT_TRUE(r.get("flag").requires_grad());
  EXPECT_TRUE(r.meta[6].is_parameter());
  EXPECT_FALSE(r.get("full").requires_grad());

  // One allocation: a write through one view shows through the others.
  r.get("full").data_ptr<float>()[17] = 1234.5f;
  EXPECT_EQ(r.get("strided")[0].item<float>(), 1234.5f);
  EXPECT_EQ(r.get("transposed")[7][1].item<float>(), 1234.5f);
  EXPECT_EQ(r.get("full").data_ptr(), r.storages_by_key.at("flat").data_ptr());

  // No object pickle in this container (not made from a .pt): the tree is every tensor by name,
  // in table order, the very tensors of `tensors`.
  ASSERT_TRUE(r.tree.isGenericDict());
  c10::impl::GenericDict tree = r.tree.toGenericDict();
  ASSERT_EQ(tree.size(), r.tensors.size());
  size_t i = 0;
  for (const auto& entry : tree) {
    EXPECT_EQ(entry.key().toStringRef(), r.tensors[i].first);
    EXPECT_TRUE(entry.value().toTensor().is_same(r.tensors[i].second)) << r.tensors[i].first;
    ++i;
  }
}

TEST(Load, ConjAndNegBitsAsTorchSetsThem) {
  testing::TempDir dir;
  Fixture f;
  std::vector<uint8_t> raw = RandomBytes(8 * 4, 3);
  uint32_t s = f.AddStorage("c", raw, DType::kComplex64);
  f.AddTensor("plain", s, DType::kComplex64, {4}, {1});
  f.AddTensor("conj", s, DType::kComplex64, {4}, {1}, 0, format::kTensorConj);
  f.AddTensor("neg", s, DType::kComplex64, {4}, {1}, 0, format::kTensorNeg);
  std::string path = f.WriteIn(dir, "conj.zckpt");
  LoadResult r = Load(path, kCpu);
  EXPECT_TRUE(r.get("conj").is_conj());
  EXPECT_TRUE(r.get("neg").is_neg());
  EXPECT_TRUE(at::equal(r.get("conj").resolve_conj(), r.get("plain").conj_physical()));
  EXPECT_TRUE(at::equal(r.get("neg").resolve_neg(), r.get("plain").neg()));
}

TEST(Load, DtypeThisTorchLacksIsRefused) {
  int lacking = 0;
  for (uint16_t code = 1; code <= kMaxDTypeCode; ++code) {
    auto d = static_cast<DType>(code);
    try {
      (void)loader::ToScalarType(d, "probe");
      continue;
    } catch (const Error&) {
    }
    ++lacking;
    testing::TempDir dir;
    Fixture f;
    f.AddContiguous("t", d, {4}, code);
    std::string path = f.WriteIn(dir, "lacking.zckpt");
    try {
      Load(path, kCpu);
      ADD_FAILURE() << DTypeName(d) << " loaded into a torch that lacks it";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(DTypeName(d)), std::string::npos) << e.what();
    }
  }
  if (lacking == 0) GTEST_SKIP() << "this torch has every dtype zckpt knows";
}

TEST(Load, QuantizedIsRefusedBeforeReading) {
  testing::TempDir dir;
  Fixture f;
  f.AddContiguous("q", DType::kQInt8, {4}, 1);
  std::string path = f.WriteIn(dir, "q.zckpt");
  try {
    Load(path, kCpu);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'q'"), std::string::npos) << e.what();
  }
  // The storages alone load (the Python module rebuilds quantized tensors with torch).
  LoadResult r = LoadStorages(path, kCpu);
  EXPECT_TRUE(r.tensors.empty());
  EXPECT_TRUE(r.tree.isNone());
  EXPECT_TRUE(testing::BytesOf(r.storages_by_key.at("sq")) == f.bytes("sq"));
}

TEST(Load, ZstdChunks) {
  testing::TempDir dir;
  Fixture f;
  f.AddStorage("packed", testing::CompressibleBytes(50000, 1));
  f.AddStorage("noise", RandomBytes(30000, 2));  // stays raw: compression does not pay
  f.AddStorage("mixed", [] {
    auto b = testing::CompressibleBytes(40000, 3);
    auto n = RandomBytes(8192, 4);
    std::copy(n.begin(), n.end(), b.begin() + 4096);  // one chunk raw, the rest compressed
    return b;
  }());
  f.AddTensor("packed", 0, DType::kUInt8, {50000}, {1});
  f.AddTensor("noise", 1, DType::kUInt8, {30000}, {1});
  f.AddTensor("mixed", 2, DType::kInt32, {10000}, {1});
  std::string path = f.WriteIn(dir, "zstd.zckpt", SmallChunks(4096, 3));
  auto c = Container::Open(path);
  int compressed = 0;
  for (uint64_t i = 0; i < c->chunk_count(); ++i) compressed += c->chunk(i).codec == 1;
  ASSERT_GT(compressed, 10);
  for (bool direct : {true, false}) {
    LoadOptions o;
    o.cpu_read_into_destination = direct;
    o.slot_bytes = 16384;
    LoadResult r = Load(path, kCpu, o);
    ExpectMatches(f, r);
    EXPECT_LT(r.stats.stored_bytes, r.stats.raw_bytes);
  }
}

// A fixture bigger than the ring many times over: several storages, one far larger than the
// whole ring, plus small ones in between.
Fixture BigAndSmall(uint64_t seed) {
  Fixture f;
  f.AddContiguous("big", DType::kFloat32, {256, 1024}, seed);  // 1 MiB
  for (int i = 0; i < 20; ++i) f.AddContiguous("small" + std::to_string(i), DType::kInt16, {i * 37 + 1}, seed + i);
  f.AddContiguous("mid", DType::kBFloat16, {70001}, seed + 99);
  return f;
}

class LoadMethods : public ::testing::TestWithParam<std::tuple<ReadMethod, bool>> {};

TEST_P(LoadMethods, TensorLargerThanTheRingWrapsAround) {
  auto [method, direct] = GetParam();
  testing::TempDir dir;
  Fixture f = BigAndSmall(11);
  std::string path = f.WriteIn(dir, "big.zckpt");
  LoadOptions o;
  o.method = method;
  o.cpu_read_into_destination = direct;
  o.slot_bytes = 64 << 10;  // 3 slots of 64 KiB: the 1 MiB tensor alone laps the ring 5 times
  o.slots = 3;
  o.threads = 3;
  uint64_t last_done = 0, total = 0;
  int calls = 0;
  o.progress = [&](uint64_t done, uint64_t t) {
    EXPECT_GE(done, last_done);
    last_done = done;
    total = t;
    ++calls;
  };
  LoadResult r = Load(path, kCpu, o);
  ExpectMatches(f, r);
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(total, r.stats.raw_bytes);
  EXPECT_EQ(static_cast<uint64_t>(calls), r.stats.batches);
  EXPECT_LE(r.stats.ring_bytes, 3u * ((64u << 10) + 8192u));
  EXPECT_GT(r.stats.batches, 10u);
  if (method == ReadMethod::kDirect) {
    EXPECT_TRUE(r.stats.method == ReadMethod::kDirect || r.stats.method == ReadMethod::kPread);
  } else {
    EXPECT_EQ(r.stats.method, method == ReadMethod::kAuto ? ReadMethod::kPread : method);
  }
  if (!direct || r.stats.method == ReadMethod::kDirect) {
    EXPECT_EQ(r.stats.destination_chunks, 0u);
  } else {
    EXPECT_GE(r.stats.destination_chunks, 256u + 34u);  // "big" and "mid" (1 MiB, 137 KiB) go straight in
  }
}

INSTANTIATE_TEST_SUITE_P(AllMethods, LoadMethods,
                         ::testing::Combine(::testing::Values(ReadMethod::kAuto, ReadMethod::kPread, ReadMethod::kMmap,
                                                              ReadMethod::kDirect),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(ReadMethodName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_into_destination" : "_through_ring");
                         });

TEST(Load, ThousandsOfTinyStoragesArePackedIntoSlots) {
  testing::TempDir dir;
  Fixture f;
  for (int i = 0; i < 3000; ++i) f.AddContiguous(std::string("t").append(std::to_string(i)), DType::kUInt8, {1 + i % 200}, i);
  std::string path = f.WriteIn(dir, "tiny.zckpt");
  LoadOptions o;
  o.slot_bytes = 64 << 10;
  LoadResult r = Load(path, kCpu, o);
  ExpectMatches(f, r);
  EXPECT_EQ(r.stats.chunks, 3000u);
  EXPECT_LT(r.stats.batches, 30u);  // ~300 KiB of data + padding in 64 KiB slots
}

// Storages large enough to go straight into their destinations, several O_DIRECT pieces each.
Fixture LargeStorages() {
  Fixture f;
  for (int i = 0; i < 5; ++i) f.AddContiguous("w" + std::to_string(i), DType::kBFloat16, {1024 + 3 * i, 2048}, 40 + i);
  f.AddContiguous("norm", DType::kFloat32, {3000}, 50);  // small: packed in a slot
  return f;
}

// Bytes not in the page cache are read with O_DIRECT into the destination and checked as they
// land; cached bytes still come from the page cache; a file half cached mixes both. Every way,
// the same bytes.
TEST(Load, UncachedBytesAreReadDirectAndChecked) {
  testing::TempDir dir;
  Fixture f = LargeStorages();
  std::string path = f.WriteIn(dir, "cold.zckpt", WriterOptions{});
  const bool direct = testing::EvictFromPageCache(path);
  LoadResult cold = Load(path, kCpu);
  ExpectMatches(f, cold);
  if (!direct) GTEST_SKIP() << "no O_DIRECT on this filesystem: nothing to evict, nothing read direct";
  // Most of it (reading the index at open may read ahead into the last storage's pages).
  EXPECT_GT(cold.stats.uncached_bytes, cold.stats.raw_bytes * 3 / 4);
  EXPECT_LE(cold.stats.uncached_bytes, cold.stats.raw_bytes);

  testing::ReadWhole(path);
  LoadResult warm = Load(path, kCpu);
  ExpectMatches(f, warm);
  EXPECT_EQ(warm.stats.uncached_bytes, 0u);

  auto c = Container::Open(path);
  uint64_t mid = c->storage(2).data_offset;
  testing::EvictFromPageCache(path, 0, mid);
  LoadResult half = Load(path, kCpu);
  ExpectMatches(f, half);
  EXPECT_GT(half.stats.uncached_bytes, 0u);
  EXPECT_LT(half.stats.uncached_bytes, half.stats.raw_bytes * 3 / 4);

  LoadOptions off;
  off.direct_when_uncached = false;
  testing::EvictFromPageCache(path);
  LoadResult buffered = Load(path, kCpu, off);
  ExpectMatches(f, buffered);
  EXPECT_EQ(buffered.stats.uncached_bytes, 0u);
}

// A flipped bit read cold (O_DIRECT) is caught like one read through the page cache.
TEST(Load, UncachedCorruptChunkIsNamed) {
  testing::TempDir dir;
  Fixture f = LargeStorages();
  std::string path = f.WriteIn(dir, "bad.zckpt", WriterOptions{});
  auto c = Container::Open(path);
  StorageInfo s = c->storage(3);
  format::ChunkRecord r = c->chunk(s.first_chunk + s.chunk_count - 1);
  testing::FlipBit(path, r.offset + r.stored_bytes / 2);
  if (!testing::EvictFromPageCache(path)) GTEST_SKIP() << "no O_DIRECT on this filesystem";
  try {
    LoadResult bad = Load(path, kCpu);
    FAIL() << "loaded a corrupt file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(s.first_chunk + s.chunk_count - 1)), std::string::npos)
        << e.what();
  }
}

TEST(Load, ManyReadersGiveTheSameResultAsOne) {
  testing::TempDir dir;
  Fixture f = BigAndSmall(5);
  std::string path = f.WriteIn(dir, "readers.zckpt", SmallChunks(8192, 1));
  for (bool direct : {true, false}) {
    LoadOptions one;
    one.threads = 1;
    one.slots = 1;
    one.slot_bytes = 16384;
    one.cpu_read_into_destination = direct;
    LoadOptions many = one;
    many.threads = 8;
    many.slots = 5;
    LoadResult a = Load(path, kCpu, one);
    LoadResult b = Load(path, kCpu, many);
    ExpectMatches(f, a);
    ExpectMatches(f, b);
    EXPECT_EQ(a.stats.threads, 1u);
    EXPECT_EQ(b.stats.threads, 8u);
  }
}

TEST(Load, LoadStoragesSkipsViews) {
  testing::TempDir dir;
  Fixture f = BigAndSmall(3);
  std::string path = f.WriteIn(dir, "storages.zckpt");
  LoadResult r = LoadStorages(path, kCpu);
  EXPECT_TRUE(r.tensors.empty());
  EXPECT_EQ(r.storages_by_key.size(), f.storages().size());
  for (const auto& s : f.storages()) EXPECT_TRUE(testing::BytesOf(r.storages_by_key.at(s.key)) == f.bytes(s.key));
}

// The object tree is built from the kept pickle: one that does not parse (or names a global
// that runs code) makes Load an error naming the file; object_tree = false loads the tensors.
TEST(Load, ObjectTreeFromAMalformedPickleIsAnError) {
  testing::TempDir dir;
  for (auto [pickle, kind, needle] : {
           std::tuple{std::string("\x80\x02}q\x00X\x04", 7), ErrorKind::kCorrupt, "object pickle"},  // cut short
           std::tuple{std::string("\x80\x02" "cos\nsystem\nq\x00.", 16), ErrorKind::kUnsafe, "os.system"},
       }) {
    Fixture f;
    f.AddContiguous("w", DType::kFloat32, {8}, 3);
    f.AddBlob("data.pkl", std::vector<uint8_t>(pickle.begin(), pickle.end()));
    std::string path = f.WriteIn(dir, "bad-pickle.zckpt");
    try {
      Load(path, kCpu);
      ADD_FAILURE() << "loaded a container whose object pickle is " << pickle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    // Without the tree too: the pickle is what zckpt.load would read, so a load that cannot
    // hold it against the index refuses the file rather than answer differently.
    LoadOptions o;
    o.object_tree = false;
    try {
      Load(path, kCpu, o);
      ADD_FAILURE() << "loaded (object_tree off) a container whose object pickle is " << pickle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
    }
    // The storages alone (what the Python module reads, after vetting the pickle itself) load.
    EXPECT_EQ(LoadStorages(path, kCpu).storages_by_key.size(), 1u);
  }
}

TEST(Load, NoVerifyStillLoads) {
  testing::TempDir dir;
  Fixture f = BigAndSmall(4);
  std::string path = f.WriteIn(dir, "nv.zckpt");
  LoadOptions o;
  o.verify = false;
  LoadResult r = Load(path, kCpu, o);
  ExpectMatches(f, r);
  EXPECT_FALSE(r.stats.verified);
}

TEST(Load, EmptyContainer) {
  testing::TempDir dir;
  Fixture f;
  f.AddStorage("nothing", {});
  f.AddTensor("none", 0, DType::kFloat32, {0}, {1});
  std::string path = f.WriteIn(dir, "empty.zckpt");
  LoadResult r = Load(path, kCpu);
  EXPECT_EQ(r.get("none").numel(), 0);
  EXPECT_EQ(r.stats.batches, 0u);
  EXPECT_EQ(r.stats.ring_bytes, 0u);
}

TEST(Load, BadOptionsAndFiles) {
  testing::TempDir dir;
  Fixture f = BigAndSmall(1);
  std::string path = f.WriteIn(dir, "o.zckpt");
  try {
    Load(dir.File("missing.zckpt"), kCpu);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
  }
  try {
    Load(path, c10::Device(c10::kMeta));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

TEST(Load, SlotBytesRoundUpToTheChunk) {
  testing::TempDir dir;
  Fixture f = BigAndSmall(2);
  std::string path = f.WriteIn(dir, "r.zckpt", SmallChunks(16384));
  LoadOptions o;
  o.slot_bytes = 1000;  // less than a chunk: a slot must hold a whole chunk
  o.cpu_read_into_destination = false;
  LoadResult r = Load(path, kCpu, o);
  ExpectMatches(f, r);
  EXPECT_EQ(r.stats.slot_bytes, 16384u);
  o.slot_bytes.reset();  // unset: max(chunk, kDefaultSlotBytes)
  EXPECT_EQ(Load(path, kCpu, o).stats.slot_bytes, 8u << 20);
  o.slot_bytes = 0;  // 0 is the default, as unset
  EXPECT_EQ(Load(path, kCpu, o).stats.slot_bytes, 8u << 20);
}

// The ring's slots follow the reader threads the load runs with (--slots' default "threads + 2,
// at least 4"), not the default thread count of when the options were built.
// One resolver says what every unset option (or one set to 0) becomes, for a file and for an
// object; any other set option is taken as it is (an object's connections never override the
// caller's threads).
TEST(LoadOptions, OneResolverForEverySize) {
  LoadOptions o;
  LoadSizes file = ResolveLoadSizes(o, 1 << 20);
  EXPECT_EQ(file.threads, DefaultReaderThreads());
  EXPECT_EQ(file.slots, std::max(kMinRingSlots, file.threads + 2));
  EXPECT_EQ(file.slot_bytes, kDefaultSlotBytes);
  EXPECT_EQ(file.batch_bytes, kDestinationBatchBytes);
  EXPECT_EQ(ResolveLoadSizes(o, 32 << 20).slot_bytes, 32u << 20);  // a slot holds a chunk
  LoadSizes object = ResolveLoadSizes(o, 1 << 20, 16);
  EXPECT_EQ(object.threads, std::max(16u, DefaultReaderThreads()));
  EXPECT_EQ(object.slots, object.threads + 2);
  EXPECT_EQ(object.batch_bytes, kObjectBatchBytes);
  o.threads = 3;
  o.slot_bytes = 5000;  // rounded up to 4 KiB, and a batch is a slot's worth
  object = ResolveLoadSizes(o, 4096, 16);
  EXPECT_EQ(object.threads, 3u);
  EXPECT_EQ(object.slot_bytes, 8192u);
  EXPECT_EQ(object.batch_bytes, 8192u);
  LoadOptions zero;  // 0 is the default, as unset
  zero.threads = 0u;
  zero.slots = 0u;
  zero.slot_bytes = 0u;
  LoadSizes unset = ResolveLoadSizes(LoadOptions{}, 4096, 16), zeroed = ResolveLoadSizes(zero, 4096, 16);
  EXPECT_EQ(zeroed.threads, unset.threads);
  EXPECT_EQ(zeroed.slots, unset.slots);
  EXPECT_EQ(zeroed.slot_bytes, unset.slot_bytes);
  EXPECT_EQ(zeroed.batch_bytes, unset.batch_bytes);
}

TEST(LoadOptions, SlotsFollowTheReaderThreads) {
  LoadOptions o;
  EXPECT_FALSE(o.slots);  // "the default": resolved when the load runs
  o.threads = 10;
  EXPECT_EQ(ResolveLoadSizes(o, 1 << 20).slots, 12u);
  o.threads = 1;
  EXPECT_EQ(ResolveLoadSizes(o, 1 << 20).slots, 4u);
  o.slots = 3;
  EXPECT_EQ(ResolveLoadSizes(o, 1 << 20).slots, 3u);

  testing::TempDir dir;
  Fixture f;
  f.AddContiguous("w", DType::kFloat32, {64, 1024}, 7);  // 256 KiB: 64 slot batches of 4 KiB
  std::string path = f.WriteIn(dir, "m.zckpt");
  LoadOptions load;
  load.threads = 9;
  load.slot_bytes = 4096;
  load.cpu_read_into_destination = false;  // every chunk through the ring
  LoadResult r = Load(path, kCpu, load);
  EXPECT_EQ(r.stats.threads, 9u);
  EXPECT_EQ(r.stats.slots, 11u);
}

}  // namespace
}  // namespace zckpt
