// Hostile and broken bytes: every failure is a clean zckpt::Error naming the opcode offset,
// never a crash, an overflow, a huge allocation or deep recursion.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>

#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "pickle/value.h"
#include "pickle_test_util.h"

namespace zckpt::pickle {
namespace {

using testing::ExpectUnpickleError;
using testing::PickleBuilder;
using testing::ToBytes;

// A pickle exercising most binary opcodes (protocol 4 with a frame, memo, marks, globals).
std::vector<uint8_t> SamplePickle() {
  PickleBuilder b;
  b.Proto(4).Op(0x95).LE(0, 8);  // frame length patched below
  b.Op('}').Op(0x94).Mark();
  b.ShortUnicode("weights").Op(0x94).StackGlobal("torch._utils", "_rebuild_tensor_v2").Op(0x94);
  b.Mark().Mark().ShortUnicode("storage").StackGlobal("torch", "FloatStorage").ShortUnicode("0").ShortUnicode("cpu")
      .Int1(6).Op('t').Op('Q').Int1(0).Int1(2).Int1(3).Op(0x86).Int1(3).Int1(1).Op(0x86).Op(0x89)
      .StackGlobal("collections", "OrderedDict").Op(')').Op('R').Op('t').Op('R');
  b.ShortUnicode("list").Op(']').Op(0x94).Mark().Op('J').LE(0xFFFFFF85, 4).Op('G').LE(0, 8).Op(0x8a).LE(9, 1)
      .Raw(std::string(8, '\xff')).Raw("\x7f").Op('h').LE(1, 1).Op('e');
  b.ShortUnicode("set").Op(0x8f).Mark().Op('N').Op(0x88).Op(0x90);
  b.Op('u').Stop();
  std::vector<uint8_t> bytes = b.bytes();
  uint64_t frame = bytes.size() - 11;
  for (int i = 0; i < 8; ++i) bytes[3 + i] = static_cast<uint8_t>(frame >> (8 * i));
  return bytes;
}

TEST(Malformed, SamplePickleIsValid) {
  std::vector<uint8_t> bytes = SamplePickle();
  UnpickleResult r = Unpickle(bytes);
  EXPECT_EQ(r.end_offset, bytes.size());
  TorchPickle t = InterpretTorchPickle(r);
  ASSERT_EQ(t.tensors.size(), 1u);
  EXPECT_EQ(t.tensors[0].name, "weights");
}

TEST(Malformed, EmptyInput) {
  ExpectUnpickleError({}, ErrorKind::kCorrupt, "pickle byte offset 0: pickle ended without STOP");
}

TEST(Malformed, EveryTruncationIsCorrupt) {
  std::vector<uint8_t> bytes = SamplePickle();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      Unpickle(prefix);
      ADD_FAILURE() << "prefix of " << n << " bytes accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << n << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("pickle byte offset ", 0), 0u) << e.what();
    }
  }
}

// Feeds `bytes` to Unpickle (and, when that works, to the torch interpretation): only
// zckpt::Error may come out. Returns whether Unpickle succeeded.
bool SurvivesGarbage(const std::vector<uint8_t>& bytes, int* unsafe_or_unsupported) {
  try {
    UnpickleResult r = Unpickle(bytes);
    try {
      InterpretTorchPickle(r);
      Render(r.root);
    } catch (const Error&) {
    }
    return true;
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == ErrorKind::kCorrupt || e.kind() == ErrorKind::kUnsafe ||
                e.kind() == ErrorKind::kUnsupported)
        << e.what();
    if (e.kind() != ErrorKind::kCorrupt) ++*unsafe_or_unsupported;
    return false;
  }
}

TEST(Malformed, RandomBytesNeverCrash) {
  std::mt19937 rng(20240607);
  int accepted = 0, other = 0;
  // Bias towards opcode bytes so the machine gets past the first instruction.
  const std::string opcodes = "(.012FIJKLMNPQRSTUVXabcdeghijlopqrstu}])G\x80\x81\x85\x86\x87\x88\x89\x8a\x8c\x8f\x90\x93\x94\x95";
  for (int i = 0; i < 6000; ++i) {
    std::vector<uint8_t> bytes(rng() % 64);
    for (auto& b : bytes) b = (rng() % 2) ? static_cast<uint8_t>(opcodes[rng() % opcodes.size()]) : static_cast<uint8_t>(rng());
    if (rng() % 4 == 0) bytes.push_back('.');
    accepted += SurvivesGarbage(bytes, &other);
  }
  // Some random sequences are valid pickles; most are not.
  EXPECT_GT(accepted, 10);
  EXPECT_LT(accepted, 6000);
}

TEST(Malformed, MutatedPicklesNeverCrash) {
  std::mt19937 rng(7);
  const std::vector<uint8_t> sample = SamplePickle();
  int accepted = 0, other = 0;
  for (int i = 0; i < 6000; ++i) {
    std::vector<uint8_t> bytes = sample;
    for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    accepted += SurvivesGarbage(bytes, &other);
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 6000);
}

TEST(Malformed, MemoReferenceNeverStored) {
  ExpectUnpickleError(ToBytes("\x80\x02h\x05."), ErrorKind::kCorrupt, "pickle byte offset 2: memo key 5 was never stored");
  ExpectUnpickleError(ToBytes("\x80\x02j\x00\x00\x01\x00."), ErrorKind::kCorrupt, "offset 2: memo key 65536 was never stored");
  ExpectUnpickleError(ToBytes("g3\n."), ErrorKind::kCorrupt, "offset 0: memo key 3 was never stored");
  ExpectUnpickleError(ToBytes("Np-1\n."), ErrorKind::kCorrupt, "offset 1: invalid PUT argument");
  ExpectUnpickleError(ToBytes("\x80\x02q\x00."), ErrorKind::kCorrupt, "offset 2: stack underflow");
}

TEST(Malformed, UnknownOpcodeNamedInHex) {
  ExpectUnpickleError(ToBytes("\x80\x02\xff."), ErrorKind::kCorrupt, "pickle byte offset 2: unknown opcode 0xff");
  ExpectUnpickleError(ToBytes("N\x99."), ErrorKind::kCorrupt, "pickle byte offset 1: unknown opcode 0x99");
  ExpectUnpickleError(ToBytes("\x00"), ErrorKind::kCorrupt, "pickle byte offset 0: unknown opcode 0x00");
}

TEST(Malformed, HugeLengthClaimsAreCleanErrors) {
  // 100 bytes of pickle claiming 4 GiB and more.
  auto padded = [](PickleBuilder b) {
    std::vector<uint8_t> v = b.bytes();
    v.resize(100, 'N');
    return v;
  };
  ExpectUnpickleError(padded(PickleBuilder().Proto(4).Op(0x8e).LE(uint64_t{1} << 32, 8)), ErrorKind::kCorrupt,
                      "pickle byte offset 2: BINBYTES8 claims 4294967296 bytes but only 89 remain");
  ExpectUnpickleError(padded(PickleBuilder().Proto(4).Op(0x8d).LE(~uint64_t{0}, 8)), ErrorKind::kCorrupt,
                      "offset 2: BINUNICODE8 claims 18446744073709551615 bytes");
  ExpectUnpickleError(padded(PickleBuilder().Proto(2).Op('X').LE(0xFFFFFFFF, 4)), ErrorKind::kCorrupt,
                      "offset 2: BINUNICODE claims 4294967295 bytes but only 93 remain");
  ExpectUnpickleError(padded(PickleBuilder().Proto(3).Op('B').LE(0xFFFFFFFF, 4)), ErrorKind::kCorrupt,
                      "offset 2: BINBYTES claims 4294967295");
  ExpectUnpickleError(padded(PickleBuilder().Proto(5).Op(0x96).LE(uint64_t{1} << 40, 8)), ErrorKind::kCorrupt,
                      "offset 2: BYTEARRAY8 claims");
  ExpectUnpickleError(padded(PickleBuilder().Proto(4).Op(0x95).LE(uint64_t{1} << 32, 8)), ErrorKind::kCorrupt,
                      "offset 2: FRAME claims 4294967296 bytes");
  ExpectUnpickleError(padded(PickleBuilder().Proto(2).Op(0x8b).LE(0x7FFFFFFF, 4)), ErrorKind::kCorrupt,
                      "offset 2: LONG4 claims 2147483647");
  ExpectUnpickleError(padded(PickleBuilder().Proto(2).Op('T').LE(0x7FFFFFFF, 4)), ErrorKind::kCorrupt,
                      "offset 2: BINSTRING claims 2147483647");
  ExpectUnpickleError(ToBytes("T\xff\xff\xff\xff."), ErrorKind::kCorrupt, "offset 0: BINSTRING has a negative byte count");
  ExpectUnpickleError(ToBytes("\x8b\x00\x00\x00\x80."), ErrorKind::kCorrupt, "offset 0: LONG4 has a negative byte count");
  ExpectUnpickleError(ToBytes("X\x05\x00\x00"), ErrorKind::kCorrupt, "offset 0: truncated BINUNICODE argument");
}

TEST(Malformed, AFrameThatOutlastsStopIsRefused) {
  // A stream reader (torch.load of a legacy file) takes a frame whole, so the 2 bytes after STOP
  // would belong to this pickle there and shift whatever follows: refused, never read two ways.
  ExpectUnpickleError(ToBytes(std::string("\x80\x04\x95\x04\x00\x00\x00\x00\x00\x00\x00N.xy", 15)),
                      ErrorKind::kCorrupt, "FRAME claims 4 bytes, but the pickle stops 2 bytes before its end");
  // As Python frames it: the last frame ends right after STOP.
  UnpickleResult r = Unpickle(ToBytes(std::string("\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00N.", 13)));
  EXPECT_EQ(r.end_offset, 13u);
}

TEST(Malformed, DeepNestingIsAnErrorNotAStackOverflow) {
  const size_t n = 100000;
  // 100k open MARKs.
  ExpectUnpickleError(std::vector<uint8_t>(n, '('), ErrorKind::kCorrupt, "pickle byte offset 1000: more than 1000 open MARKs");
  // 100k lists, each appended to the one before: [[[[...]]]].
  std::vector<uint8_t> lists(n, ']');
  lists.insert(lists.end(), n - 1, 'a');
  lists.push_back('.');
  ExpectUnpickleError(lists, ErrorKind::kCorrupt, "pickle byte offset " + std::to_string(n + 999) + ": nesting deeper than 1000");
  // Dicts nested through SETITEM, and tuples through TUPLE1.
  std::vector<uint8_t> tuples = ToBytes("N");
  tuples.insert(tuples.end(), n, 0x85);
  ExpectUnpickleError(tuples, ErrorKind::kCorrupt, "pickle byte offset 1000: nesting deeper than 1000");
  PickleBuilder dicts;
  for (size_t i = 0; i < 2000; ++i) dicts.Op('}').Int1(1);
  dicts.Op('}');
  for (size_t i = 0; i < 2000; ++i) dicts.Op('s');
  ExpectUnpickleError(dicts.bytes(), ErrorKind::kCorrupt, "nesting deeper than 1000");
}

// A chain 200k lists deep built through the memo so that no append sees the depth:
// later walks of the tree (rendering, torch interpretation) must still be bounded.
TEST(Malformed, DeepChainThroughMemoIsBoundedInWalks) {
  const uint32_t n = 200000;
  PickleBuilder b;
  b.Proto(2).Op(']').Op('r').LE(0, 4);
  for (uint32_t i = 1; i <= n; ++i) {
    b.Op(']').Op('r').LE(i, 4).Op('0');        // new list, memo i
    b.Op('j').LE(i - 1, 4).Op('j').LE(i, 4);   // parent, child
    b.Op('a').Op('0');                         // parent.append(child)
  }
  b.Op('0').Op('j').LE(0, 4).Stop();
  // Every list was empty when appended, so only the finished tree shows the depth: refused there.
  testing::ExpectUnpickleError(b.bytes(), ErrorKind::kCorrupt, "nesting deeper than 1000 (max_depth)");
  // A caller that raises the limit still gets walks that bound themselves.
  UnpickleOptions deep;
  deep.max_depth = n + 10;
  UnpickleResult r = Unpickle(b.bytes(), deep);
  std::string text = Render(r.root);
  EXPECT_EQ(text.substr(0, 3), "[[[");
  EXPECT_NE(text.find("..."), std::string::npos);
  EXPECT_LT(text.size(), 3000u);
  TorchPickle model = InterpretTorchPickle(r);  // iterative: any depth
  EXPECT_TRUE(model.tensors.empty());
  // Asked to render the whole depth the pickle was read under, rendering still stops at its own
  // bound (it recurses on the stack).
  EXPECT_LT(RenderTorch(r, model).size(), 3000u);
}

// L0 = []; then per level i: Li = [] (memo i), and L(i-1).append(<wrapper of Li>) while Li is
// still empty, so the depth only shows on the finished tree. The wrapper: a dict with Li as its
// KEY, or an object called with Li as its ARGUMENT (collections.OrderedDict(Li)).
std::vector<uint8_t> ChainThroughMemo(uint32_t levels, bool through_keys) {
  PickleBuilder b;
  b.Proto(2).Global("collections", "OrderedDict").Op('r').LE(0, 4).Op('0');  // memo 0: the class
  b.Op(']').Op('r').LE(1, 4);                                                  // memo 1: L0
  for (uint32_t i = 1; i <= levels; ++i) {
    b.Op(']').Op('r').LE(i + 1, 4).Op('0');  // Li, memo i + 1
    b.Op('j').LE(i, 4);                      // L(i-1)
    if (through_keys) b.Op('}').Op('j').LE(i + 1, 4).Op('N').Op('s');        // {Li: None}
    else b.Op('j').LE(0, 4).Op('j').LE(i + 1, 4).Op(0x85).Op('R');          // OrderedDict(Li)
    b.Op('a').Op('0');
  }
  b.Op('0').Op('j').LE(1, 4).Stop();
  return b.bytes();
}

TEST(Malformed, DeepNestingThroughDictKeysAndCallArgumentsIsRefused) {
  for (bool keys : {true, false}) {
    SCOPED_TRACE(keys ? "dict keys" : "call arguments");
    auto t0 = std::chrono::steady_clock::now();
    ExpectUnpickleError(ChainThroughMemo(100000, keys), ErrorKind::kCorrupt, "nesting deeper than 1000 (max_depth)");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
    // The limit is exact: L0 holds 2 * levels + 1 nodes on its longest chain (dict/object, then
    // a list; the key of a dict, the args tuple of an object, count as one more each below).
    const uint32_t per_level = keys ? 2 : 3;
    const uint32_t fits = (1000 - 1) / per_level;
    UnpickleResult ok = Unpickle(ChainThroughMemo(fits, keys));
    EXPECT_EQ(ok.root->depth, per_level * fits + 1);
    EXPECT_TRUE(InterpretTorchPickle(ok).tensors.empty());
    ExpectUnpickleError(ChainThroughMemo(fits + 1, keys), ErrorKind::kCorrupt, "nesting deeper than 1000");
  }
}

TEST(Malformed, ACycleIsNoDepth) {
  // l = []; l.append(l); l.append([l]): cycles end a chain, they do not make it infinite.
  auto b = PickleBuilder().Proto(2).Op(']').Op('q').LE(0, 1).Op('h').LE(0, 1).Op('a');
  b.Op(']').Op('q').LE(1, 1).Op('h').LE(0, 1).Op('a').Op('a').Stop();
  UnpickleResult r = Unpickle(b.bytes());
  EXPECT_EQ(r.root->items.size(), 2u);
  EXPECT_EQ(r.root->depth, 2u);
}

TEST(Malformed, HugeDecimalLiteralsAreRefusedFast) {
  // Python's int() refuses decimal text past 4300 digits, so its unpickler refuses these too;
  // converting a million digits byte by byte took minutes.
  for (std::string op : {"I", "L"}) {
    std::string text = "\x80\x02" + op + std::string(1000000, '7') + (op == "L" ? "L" : "") + "\n.";
    auto t0 = std::chrono::steady_clock::now();
    ExpectUnpickleError(ToBytes(text), ErrorKind::kCorrupt, "more than 4300 digits");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  }
  // 4300 digits are read, and many of them stay cheap (19 digits a step).
  std::string digits(4300, '9');
  UnpickleResult one = Unpickle(ToBytes("I" + digits + "\n."));
  EXPECT_EQ(one.root->kind, Kind::kBigInt);
  EXPECT_EQ(one.root->text.size(), 1786u);  // 4300 * log2(10) / 8, plus the sign bit
  std::string many = "(";
  for (int i = 0; i < 2000; ++i) many += "I-" + digits + "\n";
  many += "l.";
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Unpickle(ToBytes(many)).root->items.size(), 2000u);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

// {first: t, 'w': t, 'w': t, ...}: one tensor under `entries` keys, all equal after the first
// (a pickled dict may repeat a key).
std::vector<uint8_t> TensorUnderEqualKeys(int entries, const std::string& first = "w") {
  PickleBuilder b;
  b.Proto(2).Op('}').Mark().Unicode(first).Global("torch._utils", "_rebuild_tensor_v2").Mark();
  b.Mark().Unicode("storage").Global("torch", "FloatStorage").Unicode("0").Unicode("cpu").Int1(1).Op('t').Op('Q');
  b.Int1(0).Op(')').Op(')').Op(0x89).Op('}').Op('t').Op('R').Op('q').LE(1, 1);
  for (int i = 1; i < entries; ++i) b.Unicode("w").Op('h').LE(1, 1);
  b.Op('u').Stop();
  return b.bytes();
}

TEST(Malformed, OneTensorUnderManyEqualKeysIsNamedInLinearTime) {
  // Each repeat is named w~N: searching N up from 1 every time was quadratic (minutes here).
  auto t0 = std::chrono::steady_clock::now();
  TorchPickle m = InterpretTorchPickle(Unpickle(TensorUnderEqualKeys(100000)));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  ASSERT_EQ(m.tensors.size(), 100000u);
  EXPECT_EQ(m.tensors[0].name, "w");
  EXPECT_EQ(m.tensors[1].name, "w~1");
  EXPECT_EQ(m.tensors[99999].name, "w~99999");
  // A name the pickle itself spells w~2 is skipped, not given twice.
  TorchPickle n = InterpretTorchPickle(Unpickle(TensorUnderEqualKeys(5, "w~2")));
  std::vector<std::string> names;
  for (const TorchTensor& t : n.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"w~2", "w", "w~1", "w~3", "w~4"}));
}

TEST(Malformed, SharedSubtreesDoNotExplode) {
  // x0 = [1]; x(i+1) = [xi, xi]: 2^200 leaves through sharing.
  PickleBuilder b;
  b.Proto(2).Op(']').Int1(1).Op('a');
  for (int i = 0; i < 200; ++i) b.Op('q').LE(0, 1).Op('h').LE(0, 1).Op(0x86);
  b.Stop();
  UnpickleResult r = Unpickle(b.bytes());
  std::string text = Render(r.root, 1000, 10000);
  EXPECT_LE(text.size(), 10000u + 3u + 200u);
  EXPECT_EQ(text.substr(text.size() - 3), ")))");
  EXPECT_TRUE(InterpretTorchPickle(r).tensors.empty());
}

// Memo references cost a byte or two each; what the interpreter builds from them must stay
// proportional to the pickle, not to the references times what they point at.
TEST(Malformed, MemoAmplificationIsBounded) {
  // set(list) of a 100k-member list, 2000 times.
  PickleBuilder sets;
  sets.Proto(2).Global("__builtin__", "set").Op('q').LE(0, 1).Op('0').Op(']').Op('q').LE(1, 1).Mark();
  for (int i = 0; i < 100000; ++i) sets.Op('N');
  sets.Op('e').Op('0').Mark();
  for (int i = 0; i < 2000; ++i) sets.Op('h').LE(0, 1).Op('h').LE(1, 1).Op(0x85).Op('R');
  sets.Op('l').Stop();
  ExpectUnpickleError(sets.bytes(), ErrorKind::kCorrupt, "container members (twice the pickle's size)");
  // encode(one MB of text) 5000 times.
  PickleBuilder text;
  text.Proto(2).Global("_codecs", "encode").Op('q').LE(0, 1).Op('0').Unicode(std::string(1 << 20, 'a'))
      .Op('q').LE(1, 1).Op('0').Unicode("latin1").Op('q').LE(2, 1).Op('0').Mark();
  for (int i = 0; i < 5000; ++i) text.Op('h').LE(0, 1).Op('h').LE(1, 1).Op('h').LE(2, 1).Op(0x86).Op('R');
  text.Op('l').Stop();
  ExpectUnpickleError(text.bytes(), ErrorKind::kCorrupt, "bytes of str/bytes data (max_total_bytes, or twice the pickle)");
}

std::vector<uint8_t> TensorUnderKey(const std::string& key, int references) {
  // {key: [t, t, ...]} with t a 1024-dimensional one-element tensor shared through the memo.
  PickleBuilder b;
  b.Proto(2).Op('}').Unicode(key).Op(']').Mark().Global("torch._utils", "_rebuild_tensor_v2").Mark();
  b.Mark().Unicode("storage").Global("torch", "FloatStorage").Unicode("0").Unicode("cpu").Int1(1).Op('t').Op('Q');
  b.Int1(0).Mark();
  for (int i = 0; i < 1024; ++i) b.Int1(1);
  b.Op('t').Op('q').LE(9, 1).Op('h').LE(9, 1).Op(0x89).Op('}').Op('t').Op('R').Op('q').LE(10, 1);
  for (int i = 1; i < references; ++i) b.Op('h').LE(10, 1);
  b.Op('e').Op('s').Stop();
  return b.bytes();
}

TEST(Malformed, TensorRecordsAreBounded) {
  TorchPickle few = InterpretTorchPickle(Unpickle(TensorUnderKey("k", 3)));
  ASSERT_EQ(few.tensors.size(), 3u);
  EXPECT_EQ(few.tensors[2].name, "k.2");
  EXPECT_EQ(few.tensors[2].shape.size(), 1024u);
  // One tensor reached 200k times: 200k records of 1024 dimensions each.
  Error many = testing::CatchError([] { InterpretTorchPickle(Unpickle(TensorUnderKey("k", 200000))); });
  EXPECT_EQ(many.kind(), ErrorKind::kCorrupt);
  EXPECT_NE(std::string(many.what()).find("tensor and numpy records exceed 268435456 bytes at 'k."), std::string::npos)
      << many.what();
  // A 100 KB key: the name would be longer than any real one; the message shows its tail only.
  Error longname = testing::CatchError([] { InterpretTorchPickle(Unpickle(TensorUnderKey(std::string(100000, 'x'), 1))); });
  EXPECT_EQ(longname.kind(), ErrorKind::kCorrupt);
  EXPECT_EQ(std::string(longname.what()).rfind("tensor name longer than 65536 bytes at '...xxx", 0), 0u) << longname.what();
  EXPECT_LT(std::string(longname.what()).size(), 300u);
}

TEST(Malformed, SharedHugeKeysCostNoMemoryPerUse) {
  // 200k dict entries under the same one-MB key: walking them must not copy the key each time.
  PickleBuilder b;
  b.Proto(2).Unicode(std::string(1 << 20, 'k')).Op('q').LE(0, 1).Op('0').Op('}').Mark();
  for (int i = 0; i < 200000; ++i) b.Op('h').LE(0, 1).Op('N');
  b.Op('u').Stop();
  UnpickleResult r = Unpickle(b.bytes());
  EXPECT_EQ(r.root->entries.size(), 200000u);
  TorchPickle m = InterpretTorchPickle(r);
  EXPECT_TRUE(m.tensors.empty());
  EXPECT_LT(Render(r.root, 1000, 4096).size(), 4200u);
}

TEST(Malformed, StackUnderflowAndMarks) {
  ExpectUnpickleError(ToBytes("\x80\x02."), ErrorKind::kCorrupt, "pickle byte offset 2: stack underflow");
  ExpectUnpickleError(ToBytes("\x80\x02" "a."), ErrorKind::kCorrupt, "pickle byte offset 2: stack underflow");
  ExpectUnpickleError(ToBytes("K\x01\x86."), ErrorKind::kCorrupt, "pickle byte offset 2: stack underflow");
  ExpectUnpickleError(ToBytes("NR."), ErrorKind::kCorrupt, "pickle byte offset 1: stack underflow");
  // Items below a MARK are out of reach until the mark is popped (as in CPython 3).
  ExpectUnpickleError(ToBytes("](K\x01" "a."), ErrorKind::kCorrupt, "pickle byte offset 4: stack underflow");
  ExpectUnpickleError(ToBytes("N1."), ErrorKind::kCorrupt, "pickle byte offset 1: no MARK to pop to");
  ExpectUnpickleError(ToBytes("N\x80\x02t."), ErrorKind::kCorrupt, "pickle byte offset 3: no MARK to pop to");
  ExpectUnpickleError(ToBytes("K\x01(."), ErrorKind::kCorrupt, "pickle byte offset 3: stack underflow");
  EXPECT_EQ(Unpickle(ToBytes("(K\x01.")).root->integer, 1);  // STOP may leave a MARK open, as in CPython
}

TEST(Malformed, WrongTargets) {
  ExpectUnpickleError(ToBytes("}K\x01" "a."), ErrorKind::kCorrupt, "offset 3: APPEND to a dict");
  ExpectUnpickleError(ToBytes("]K\x01K\x02s."), ErrorKind::kCorrupt, "offset 5: SETITEM on a list");
  ExpectUnpickleError(ToBytes("](K\x01K\x02K\x03u."), ErrorKind::kCorrupt, "offset 8: SETITEMS with an odd number");
  ExpectUnpickleError(ToBytes("(K\x01" "d."), ErrorKind::kCorrupt, "offset 3: DICT with an odd number");
  ExpectUnpickleError(ToBytes("]}b."), ErrorKind::kCorrupt, "offset 2: BUILD on a list");
  ExpectUnpickleError(ToBytes("\x80\x04(\x91(K\x01\x90."), ErrorKind::kCorrupt, "offset 7: ADDITEMS to a frozenset");
  ExpectUnpickleError(ToBytes("(o."), ErrorKind::kCorrupt, "offset 1: OBJ without a class");
  ExpectUnpickleError(ToBytes("\x80\x04K\x01K\x02\x93."), ErrorKind::kCorrupt, "offset 6: STACK_GLOBAL requires str");
}

TEST(Malformed, BadText) {
  ExpectUnpickleError(ToBytes("X\x02\x00\x00\x00\xc3\x28."), ErrorKind::kCorrupt, "offset 0: BINUNICODE payload is not valid UTF-8");
  ExpectUnpickleError(ToBytes("Ix12\n."), ErrorKind::kCorrupt, "offset 0: invalid INT literal");
  ExpectUnpickleError(ToBytes("Fabc\n."), ErrorKind::kCorrupt, "offset 0: invalid FLOAT literal");
  ExpectUnpickleError(ToBytes("S'abc\n."), ErrorKind::kCorrupt, "offset 0: the STRING opcode argument must be quoted");
  ExpectUnpickleError(ToBytes("S'\\x4'\n."), ErrorKind::kCorrupt, "offset 0: invalid \\x escape in STRING");
  ExpectUnpickleError(ToBytes("V\\u12\n."), ErrorKind::kCorrupt, "offset 0: truncated \\uXXXX escape");
  ExpectUnpickleError(ToBytes("I12"), ErrorKind::kCorrupt, "offset 0: INT argument is not terminated by a newline");
  ExpectUnpickleError(ToBytes("cos"), ErrorKind::kCorrupt, "offset 0: GLOBAL argument is not terminated");
  ExpectUnpickleError(ToBytes("c\nname\n."), ErrorKind::kCorrupt, "offset 0: empty module or name in a global");
  ExpectUnpickleError(ToBytes("cmod\xff\nname\n."), ErrorKind::kCorrupt, "offset 0: GLOBAL argument is not valid UTF-8");
}

}  // namespace
}  // namespace zckpt::pickle
