// InterpretTorchPickle against data.pkl files torch itself wrote, compared with what torch
// reports about the same tensors (make_torch_fixtures.py writes both).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "pickle/value.h"
#include "pickle_test_util.h"
#include "test_util.h"

namespace zckpt::pickle {
namespace {

using testing::PickleBuilder;

std::string TorchDir() {
  if (!zckpt::testing::PythonHasTorch()) return "";
  return testing::FixtureDir("tests/pickle/make_torch_fixtures.py");
}

struct Loaded {
  UnpickleResult pickle;
  TorchPickle model;
};

// Under the allowlist, with the two classes the fixture script defines itself allowed by name
// (a user class, and ShardedTensor's nested class moved to module level).
Loaded Load(const std::string& dir, const std::string& name) {
  UnpickleOptions options;
  options.allow_globals = {"__main__.Custom", "torch.distributed._shard.sharded_tensor.api.ProcessGroupState"};
  Loaded l;
  l.pickle = Unpickle(testing::ReadBytes(dir + "/" + name + ".pkl"), options);
  l.model = InterpretTorchPickle(l.pickle);
  return l;
}

const TorchTensor* Find(const TorchPickle& m, const std::string& name) {
  for (const auto& t : m.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// Checks one fixture against its .expect file; returns the number of TENSOR lines.
size_t CheckCase(const std::string& dir, const std::string& name) {
  SCOPED_TRACE(name);
  Loaded l = Load(dir, name);
  const TorchPickle& m = l.model;
  std::map<std::string, size_t> group_storage;  // expected group -> our storage index
  std::set<size_t> storages_used;
  std::set<std::string> storage_keys;
  size_t tensors = 0;
  bool only_listed = true;
  for (const auto& row : testing::ReadTable(dir + "/" + name + ".expect")) {
    const std::string& what = row[0];
    if (what == "TENSOR") {
      ++tensors;
      const TorchTensor* t = Find(m, row[1]);
      if (!t) {
        ADD_FAILURE() << "no tensor " << row[1];
        continue;
      }
      EXPECT_EQ(DTypeName(t->dtype), row[2]) << row[1];
      EXPECT_EQ(testing::Csv(t->shape), row[3]) << row[1];
      EXPECT_EQ(testing::Csv(t->stride), row[4]) << row[1];
      EXPECT_EQ(std::to_string(t->storage_offset), row[5]) << row[1];
      auto [it, fresh] = group_storage.emplace(row[6], t->storage);
      EXPECT_EQ(it->second, t->storage) << row[1] << " should share storage with group " << row[6];
      if (fresh) {
        EXPECT_TRUE(storages_used.insert(t->storage).second) << row[1] << " shares a storage it should not";
      }
      EXPECT_EQ(t->requires_grad, row[7] == "1") << row[1];
      EXPECT_EQ(t->is_parameter, row[8] == "1") << row[1];
      EXPECT_EQ(t->conj, row[9] == "1") << row[1];
      EXPECT_EQ(t->neg, row[10] == "1") << row[1];
      EXPECT_EQ(t->quantized, row[11] == "quantized") << row[1];
      EXPECT_EQ(t->dtensor_local, row[11] == "dtensor") << row[1];
      EXPECT_EQ(t->sharded_local, row[11] == "sharded") << row[1];
    } else if (what == "EXTRA") {
      const TorchTensor* t = Find(m, row[1]);
      if (!t) {
        ADD_FAILURE() << "no tensor " << row[1];
        continue;
      }
      EXPECT_NE(t->extra.find(row[2]), std::string::npos) << row[1] << " extra " << t->extra << " lacks " << row[2];
    } else if (what == "STORAGE") {
      storage_keys.insert(row[1]);
      bool found = false;
      for (const auto& s : m.storages) {
        if (s.key != row[1]) continue;
        found = true;
        EXPECT_EQ(std::to_string(s.nbytes), row[2]) << "storage " << row[1] << " (" << s.storage_type << ")";
        EXPECT_EQ(s.location, row[3]) << "storage " << row[1];
      }
      EXPECT_TRUE(found) << "no storage " << row[1];
    } else if (what == "NUMPY") {
      bool found = false;
      for (const auto& n : m.numpy) {
        if (n.path != row[1]) continue;
        found = true;
        EXPECT_EQ(n.dtype, row[2]) << row[1];
        EXPECT_EQ(n.scalar ? "-" : testing::Csv(n.shape), row[3]) << row[1];
        EXPECT_EQ(n.scalar, row[4] == "1") << row[1];
      }
      EXPECT_TRUE(found) << "no numpy value " << row[1];
    } else if (what == "OPAQUE") {
      if (m.opaque_globals.empty()) {
        ADD_FAILURE() << "no opaque globals";
        continue;
      }
      EXPECT_EQ(m.opaque_globals[0].name, row[1]);
      EXPECT_EQ(std::to_string(m.opaque_globals[0].count), row[2]);
    } else if (what == "OPAQUE_NONE") {
      EXPECT_TRUE(m.opaque_globals.empty()) << m.opaque_globals[0].name;
    } else if (what == "RENDER_CONTAINS") {
      EXPECT_NE(Render(l.pickle.root).find(row[1]), std::string::npos) << Render(l.pickle.root).substr(0, 300);
    } else if (what == "ONLY_LISTED_TENSORS") {
      only_listed = row[1] == "1";
    }
  }
  EXPECT_EQ(m.storages.size(), storage_keys.size()) << "storages beyond the zip's data/ records";
  if (only_listed) {
    EXPECT_EQ(m.tensors.size(), tensors);
  }
  std::set<std::string> names;
  for (const auto& t : m.tensors) EXPECT_TRUE(names.insert(t.name).second) << "duplicate name " << t.name;
  return tensors;
}

// Tests on the files make_torch_fixtures.py wrote; `dir` is their folder.
class TorchFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    ZCKPT_REQUIRE_TORCH();
    dir = TorchDir();
    ASSERT_FALSE(dir.empty());
  }
  std::string dir;
};

class TorchFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchFixtures, MatchTorch) {
  ZCKPT_REQUIRE_TORCH();
  std::string dir = TorchDir();
  ASSERT_FALSE(dir.empty());
  EXPECT_GT(CheckCase(dir, GetParam()), 0u);
}

INSTANTIATE_TEST_SUITE_P(Cases, TorchFixtures,
                         ::testing::Values("dtypes", "views", "state_dict", "optimizer", "rng", "proto2", "proto4",
                                           "proto5", "quantized", "opaque", "bare_tensor", "cuda_location",
                                           "dtensor", "sharded"));

TEST_F(TorchFiles, EveryDtypeIsCovered) {
  Loaded l = Load(dir, "dtypes");
  std::set<std::string> seen;
  for (const auto& t : l.model.tensors) seen.insert(std::string(DTypeName(t.dtype)));
  for (const char* d : {"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
                        "bfloat16", "float16", "complex32", "complex64", "complex128", "bool", "uint16", "uint32",
                        "uint64", "uint8", "int8", "float4_e2m1fn_x2", "bits8"})
    EXPECT_TRUE(seen.count(d)) << d;
  // torch 2.x writes the newer dtypes as UntypedStorage + _rebuild_tensor_v3.
  const TorchTensor* f8 = Find(l.model, "float8_e5m2");
  ASSERT_NE(f8, nullptr);
  EXPECT_EQ(f8->rebuild, "_rebuild_tensor_v3");
  EXPECT_TRUE(l.model.storages[f8->storage].untyped);
  EXPECT_EQ(l.model.storages[f8->storage].storage_type, "torch.storage.UntypedStorage");
}

TEST_F(TorchFiles, DtypeUnknownToThisBuildIsUnsupported) {
  if (!zckpt::testing::FileExists(dir + "/bcomplex32.pkl")) GTEST_SKIP() << "torch has no bcomplex32";
  UnpickleResult r = Unpickle(testing::ReadBytes(dir + "/bcomplex32.pkl"));
  if (DTypeFromName("bcomplex32")) {
    EXPECT_EQ(DTypeName(InterpretTorchPickle(r).tensors.at(0).dtype), "bcomplex32");
  } else {
    Error e = testing::CatchError([&] { InterpretTorchPickle(r); });
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(std::string(e.what()), "tensor 'z': dtype torch.bcomplex32 is not supported");
  }
}

TEST_F(TorchFiles, ProtocolsAgree) {
  Loaded p2 = Load(dir, "proto2"), p4 = Load(dir, "proto4"), p5 = Load(dir, "proto5");
  ASSERT_EQ(p2.model.tensors.size(), 3u);
  for (const Loaded* other : {&p4, &p5}) {
    ASSERT_EQ(other->model.tensors.size(), p2.model.tensors.size());
    for (size_t i = 0; i < p2.model.tensors.size(); ++i) {
      EXPECT_EQ(other->model.tensors[i].name, p2.model.tensors[i].name);
      EXPECT_EQ(other->model.tensors[i].shape, p2.model.tensors[i].shape);
      EXPECT_EQ(other->model.tensors[i].dtype, p2.model.tensors[i].dtype);
    }
  }
  // b"raw\xff" is the _codecs.encode idiom under protocol 2 and BINBYTES under 4 and 5.
  for (const Loaded* l : {&p2, &p4, &p5}) {
    const Value* b = Sequence(DictGet(l->pickle.root, "b"))->at(1);
    EXPECT_EQ(b->kind, Kind::kBytes);
    EXPECT_EQ(b->text, "raw\xff");
  }
}

TEST_F(TorchFiles, TiedWeightsAreOneTensorAndViewsShareAStorage) {
  Loaded l = Load(dir, "views");
  // The same Parameter object under two keys: one record per path, the same view of one storage.
  const TorchTensor* a = Find(l.model, "tied_a");
  const TorchTensor* b = Find(l.model, "tied_b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->storage, b->storage);
  EXPECT_EQ(a->pickle_offset, b->pickle_offset);
  EXPECT_TRUE(b->is_parameter);
  const TorchTensor* base = Find(l.model, "base");
  const TorchTensor* column = Find(l.model, "column");
  ASSERT_TRUE(base && column);
  EXPECT_EQ(base->storage, column->storage);
  EXPECT_EQ(l.model.storages[base->storage].numel, 24u);
  EXPECT_EQ(l.model.storages[base->storage].storage_type, "torch.FloatStorage");
  EXPECT_EQ(base->rebuild, "_rebuild_tensor_v2");
}

TEST_F(TorchFiles, StateDictAndOptimizerNames) {
  Loaded sd = Load(dir, "state_dict");
  std::vector<std::string> names;
  for (const auto& t : sd.model.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "2.running"}));
  std::string text = Render(sd.pickle.root);
  EXPECT_NE(text.find(".__setstate__({'_metadata': OrderedDict({'': {'version': 1}"), std::string::npos) << text;
  Loaded opt = Load(dir, "optimizer");
  EXPECT_EQ(opt.model.tensors.front().name, "state.0.step");
  EXPECT_TRUE(opt.model.tensors.front().shape.empty());
  EXPECT_NE(Find(opt.model, "state.3.exp_avg_sq"), nullptr);
}

// Every proper prefix of data.pkl files torch wrote is a clean kCorrupt.
TEST_F(TorchFiles, EveryTruncationIsCorrupt) {
  for (const char* name : {"state_dict.pkl", "optimizer.pkl", "proto5.pkl"}) {
    std::vector<uint8_t> bytes = testing::ReadBytes(dir + "/" + name);
    ASSERT_GT(bytes.size(), 100u);
    for (size_t n = 0; n < bytes.size(); ++n) {
      Error e = testing::CatchError([&] { Unpickle(std::span<const uint8_t>(bytes).first(n)); });
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << name << " cut at " << n << ": " << e.what();
    }
  }
}

TEST_F(TorchFiles, RenderTorchSummarizesTensors) {
  Loaded sd = Load(dir, "state_dict");
  std::string text = RenderTorch(sd.pickle, sd.model);
  EXPECT_EQ(text.rfind("OrderedDict({'0.weight': <tensor '0.weight' float32[8, 4]>, '0.bias': <tensor '0.bias' float32[8]>", 0), 0u)
      << text;
  Loaded dt = Load(dir, "dtensor");
  std::string d = RenderTorch(dt.pickle, dt.model);
  EXPECT_NE(d.find("'param': <tensor 'param' float32[2, 2] param dtensor>"), std::string::npos) << d;
  Loaded q = Load(dir, "quantized");
  EXPECT_NE(RenderTorch(q.pickle, q.model).find("<tensor 'q' quint8[3] quantized>"), std::string::npos);
  // Without a model the persistent ids still read as storages.
  EXPECT_NE(RenderTorch(sd.pickle, TorchPickle{}).find("(<storage '0'>, 0, (8, 4), (4, 1), False, OrderedDict({}))"),
            std::string::npos) << RenderTorch(sd.pickle, TorchPickle{});
}

TEST_F(TorchFiles, ShardedTensorAsTorchWritesItIsRead) {
  // torch pickles the nested ProcessGroupState class as `__builtin__ getattr`(ShardedTensor,
  // 'ProcessGroupState'): read as the global ShardedTensor.ProcessGroupState, the file gives
  // what the variant with the class at module level (a plain GLOBAL) gives.
  Loaded real = Load(dir, "sharded_real");
  Loaded plain = Load(dir, "sharded");
  bool nested = false;
  for (const GlobalRef& g : real.pickle.globals) {
    EXPECT_NE(g.name, "getattr") << g.module;
    nested = nested || (g.module == "torch.distributed._shard.sharded_tensor.api" && g.name == "ShardedTensor.ProcessGroupState");
  }
  EXPECT_TRUE(nested);
  ASSERT_EQ(real.model.tensors.size(), plain.model.tensors.size());
  ASSERT_FALSE(real.model.tensors.empty());
  for (size_t i = 0; i < real.model.tensors.size(); ++i) {
    const TorchTensor &a = real.model.tensors[i], &b = plain.model.tensors[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.sharded_local, b.sharded_local);
    EXPECT_TRUE(a.sharded_local) << a.name;
    EXPECT_EQ(a.extra, b.extra);
  }
}

// getattr is read in that one form only: on a refused global, a non-identifier, a dunder, a
// non-global, or getattr itself kept as a value, it is refused at its own offset.
TEST(GetattrForm, OnlyClassAndPublicNameIsRead) {
  UnpickleOptions describe;  // OrderedDict.Inner is no data global: judged by the deny list only
  describe.globals = GlobalPolicy::kDenyListOnly;
  auto unpickle = [&](const std::string& text) {
    return Unpickle(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()), describe);
  };
  UnpickleResult ok = unpickle("c__builtin__\ngetattr\n(ccollections\nOrderedDict\nS'Inner'\ntR.");
  ASSERT_EQ(ok.root->kind, Kind::kGlobal);
  EXPECT_EQ(ok.root->text, "collections");
  EXPECT_EQ(ok.root->name, "OrderedDict.Inner");
  for (const std::string& bad : {
           std::string("c__builtin__\ngetattr\n(cposixpath\njoin\nS'__globals__'\ntR."),   // dunder
           std::string("c__builtin__\ngetattr\n(ccollections\nOrderedDict\nS'a.b'\ntR."),  // not an identifier
           std::string("c__builtin__\ngetattr\n(S'text'\nS'upper'\ntR."),                    // not a global
           std::string("c__builtin__\ngetattr\n(ccollections\nOrderedDict\ntR."),          // wrong arity
           std::string("c__builtin__\ngetattr\n."),                                             // kept as a value
           std::string("(c__builtin__\ngetattr\nl."),                                            // inside a list
       }) {
    Error e = testing::CatchError([&] { unpickle(bad); });
    EXPECT_EQ(e.kind(), ErrorKind::kUnsafe) << bad << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).find("refused global '__builtin__.getattr' at pickle byte offset "), 0u)
        << bad << ": " << e.what();
  }
  // Folded names are judged as if written: getattr(posixpath.os, 'system') is os.system.
  Error e = testing::CatchError([&] { unpickle("c__builtin__\ngetattr\n(cposixpath\nos\nS'system'\ntR."); });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsafe) << e.what();
  EXPECT_NE(std::string(e.what()).find("posixpath.os.system"), std::string::npos) << e.what();
}

TEST_F(TorchFiles, DTensorMeshIsWalked) {
  Loaded l = Load(dir, "dtensor");
  // The three local tensors plus the mesh's rank tensor, found once through the shared mesh.
  size_t mesh_tensors = 0;
  for (const auto& t : l.model.tensors) {
    bool mesh = t.name.find("._spec.mesh.") != std::string::npos;
    mesh_tensors += mesh;
    EXPECT_EQ(t.internal, mesh) << t.name;  // the mesh is the DTensors' metadata, not a tensor of the file's
  }
  EXPECT_EQ(mesh_tensors, 1u);
  EXPECT_EQ(l.model.tensors.size(), 4u);
  EXPECT_NE(Find(l.model, "layer.weight")->extra.find("\"class\":\"torch.distributed.tensor.DTensor\""),
            std::string::npos);
  EXPECT_TRUE(l.model.opaque_globals.empty());
}

// Hand-built pickles: what the interpretation rejects.
PickleBuilder& Storage(PickleBuilder& b, const char* type, const char* key, int numel) {
  return b.Mark().Unicode("storage").Global("torch", type).Unicode(key).Unicode("cpu").Int1(static_cast<uint8_t>(numel))
      .Op('t').Op('Q');
}

std::vector<uint8_t> TensorPickle(int numel, int offset, int size0, int stride0) {
  PickleBuilder b;
  b.Proto(2).Op('}').Unicode("w").Global("torch._utils", "_rebuild_tensor_v2").Mark();
  Storage(b, "FloatStorage", "0", numel).Int1(static_cast<uint8_t>(offset)).Int1(static_cast<uint8_t>(size0))
      .Op(0x85).Int1(static_cast<uint8_t>(stride0)).Op(0x85).Op(0x89).Global("collections", "OrderedDict")
      .Op(')').Op('R').Op('t').Op('R').Op('s').Stop();
  return b.bytes();
}

TEST(TorchModel, TensorPastItsStorageIsCorrupt) {
  EXPECT_EQ(InterpretTorchPickle(Unpickle(TensorPickle(6, 0, 6, 1))).tensors.at(0).shape,
            std::vector<int64_t>{6});
  EXPECT_NO_THROW(InterpretTorchPickle(Unpickle(TensorPickle(6, 5, 1, 1))));
  Error e = testing::CatchError([] { InterpretTorchPickle(Unpickle(TensorPickle(6, 1, 6, 1))); });
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  EXPECT_EQ(std::string(e.what()), "tensor 'w': reaches element 6 (4 bytes each) past its storage's 24 bytes");
  Error s = testing::CatchError([] { InterpretTorchPickle(Unpickle(TensorPickle(6, 0, 3, 3))); });
  EXPECT_NE(std::string(s.what()).find("tensor 'w': reaches element 6"), std::string::npos) << s.what();
  EXPECT_NO_THROW(InterpretTorchPickle(Unpickle(TensorPickle(6, 9, 0, 1))));  // empty: no extent
}

TEST(TorchModel, HugeShapesDoNotOverflow) {
  // size (2^62,) stride (4,) in a 6-element storage: the product overflows 64 bits.
  PickleBuilder b;
  b.Proto(2).Global("torch._utils", "_rebuild_tensor_v2").Mark();
  Storage(b, "FloatStorage", "0", 6).Int1(0).Op(0x8a).LE(8, 1).LE(uint64_t{1} << 62, 8).Op(0x85).Int1(4).Op(0x85)
      .Op(0x89).Op('}').Op('t').Op('R').Stop();
  Error e = testing::CatchError([&] { InterpretTorchPickle(Unpickle(b.bytes())); });
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  EXPECT_NE(std::string(e.what()).find("tensor 'tensor': reaches element"), std::string::npos) << e.what();
}

TEST(TorchModel, ConflictingStorageClaimsAreCorrupt) {
  PickleBuilder b;
  b.Proto(2).Mark();
  Storage(b, "FloatStorage", "0", 6);
  Storage(b, "FloatStorage", "0", 7);
  b.Op('l').Stop();
  Error e = testing::CatchError([&] { InterpretTorchPickle(Unpickle(b.bytes())); });
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  EXPECT_NE(std::string(e.what()).find("storage key '0' claimed as torch.FloatStorage[6] on cpu and as torch.FloatStorage[7]"),
            std::string::npos) << e.what();
  PickleBuilder same;
  same.Proto(2).Mark();
  Storage(same, "HalfStorage", "k", 3);
  Storage(same, "HalfStorage", "k", 3);
  same.Op('l').Stop();
  TorchPickle m = InterpretTorchPickle(Unpickle(same.bytes()));
  ASSERT_EQ(m.storages.size(), 1u);
  EXPECT_EQ(m.storages[0].nbytes, 6u);
  PickleBuilder unknown;
  unknown.Proto(2);
  Storage(unknown, "MysteryStorage", "0", 1).Stop();
  // Off the allowlist (kUnsafe); read by a describing reader, a storage class this build does
  // not know (kUnsupported).
  EXPECT_EQ(testing::CatchError([&] { InterpretTorchPickle(Unpickle(unknown.bytes())); }).kind(), ErrorKind::kUnsafe);
  UnpickleOptions describe;
  describe.globals = GlobalPolicy::kDenyListOnly;
  EXPECT_EQ(testing::CatchError([&] { InterpretTorchPickle(Unpickle(unknown.bytes(), describe)); }).kind(),
            ErrorKind::kUnsupported);
}

TEST(TorchModel, NameCollisionsAreDisambiguated) {
  // {'a.b': t1, 'a': {'b': t2}}: both paths read "a.b".
  auto tensor = [](PickleBuilder& b, const char* key) {
    b.Global("torch._utils", "_rebuild_tensor_v2").Mark();
    Storage(b, "FloatStorage", key, 1).Int1(0).Op(')').Op(')').Op(0x89).Op('}').Op('t').Op('R');
  };
  PickleBuilder b;
  b.Proto(2).Op('}').Unicode("a.b");
  tensor(b, "0");
  b.Op('s').Unicode("a").Op('}').Unicode("b");
  tensor(b, "1");
  b.Op('s').Op('s').Stop();
  TorchPickle m = InterpretTorchPickle(Unpickle(b.bytes()));
  ASSERT_EQ(m.tensors.size(), 2u);
  EXPECT_EQ(m.tensors[0].name, "a.b");
  EXPECT_EQ(m.tensors[1].name, "a.b~1");
}

}  // namespace
}  // namespace zckpt::pickle
