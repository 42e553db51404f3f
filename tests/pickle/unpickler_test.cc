// The interpreter against Python's own pickles (protocols 0-5) and hand-built opcode
// sequences: what tree it builds, what it shares, what it refuses to fold.
#include <gtest/gtest.h>

#include <string>

#include "pickle/unpickler.h"
#include "pickle/value.h"
#include "pickle_test_util.h"
#include "test_util.h"

namespace zckpt::pickle {
namespace {

using testing::PickleBuilder;
using testing::ToBytes;

std::string PlainDir() {
  if (zckpt::testing::TestPython().empty()) return "";
  return testing::FixtureDir("tests/pickle/make_plain_pickles.py");
}

#define REQUIRE_PLAIN_DIR(dir)                                            \
  std::string dir = PlainDir();                                          \
  if (zckpt::testing::TestPython().empty()) GTEST_SKIP() << "no Python"; \
  ASSERT_FALSE(dir.empty())

UnpickleResult UnpickleFile(const std::string& path) { return Unpickle(testing::ReadBytes(path)); }

TEST(PlainPickles, RenderLikePython) {
  REQUIRE_PLAIN_DIR(dir);
  auto rows = testing::ReadTable(dir + "/expected.txt");
  ASSERT_GT(rows.size(), 100u);
  for (const auto& row : rows) {
    ASSERT_EQ(row.size(), 2u);
    std::vector<uint8_t> bytes = testing::ReadBytes(dir + "/" + row[0]);
    UnpickleResult r = Unpickle(bytes);
    EXPECT_EQ(Render(r.root), row[1]) << row[0];
    EXPECT_EQ(r.end_offset, bytes.size()) << row[0];
  }
}

// Every proper prefix of a real pickle (text protocol 0, framed protocol 5) is a clean kCorrupt.
TEST(PlainPickles, EveryTruncationIsCorrupt) {
  REQUIRE_PLAIN_DIR(dir);
  for (const char* name : {"nested_p0.pkl", "ordered_p5.pkl", "strs_p1.pkl", "ints_p2.pkl"}) {
    std::vector<uint8_t> bytes = testing::ReadBytes(dir + "/" + name);
    for (size_t n = 0; n < bytes.size(); ++n) {
      Error e = testing::CatchError([&] { Unpickle(std::span<const uint8_t>(bytes).first(n)); });
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << name << " cut at " << n << ": " << e.what();
    }
  }
}

TEST(PlainPickles, MemoSharingKeepsOneNode) {
  REQUIRE_PLAIN_DIR(dir);
  for (int proto = 0; proto <= 5; ++proto) {
    UnpickleResult r = UnpickleFile(dir + "/shared_p" + std::to_string(proto) + ".pkl");
    ASSERT_EQ(r.root->kind, Kind::kList);
    ASSERT_EQ(r.root->items.size(), 3u);
    EXPECT_EQ(r.root->items[0], r.root->items[1]) << "protocol " << proto;
    EXPECT_EQ(DictGet(r.root->items[2], "k"), r.root->items[0]) << "protocol " << proto;
  }
}

TEST(PlainPickles, RecursiveContainersPointAtThemselves) {
  REQUIRE_PLAIN_DIR(dir);
  for (int proto = 0; proto <= 5; ++proto) {
    std::string p = std::to_string(proto);
    UnpickleResult list = UnpickleFile(dir + "/recursive_list_p" + p + ".pkl");
    EXPECT_EQ(list.root->items.at(1), list.root);
    UnpickleResult tuple = UnpickleFile(dir + "/recursive_tuple_p" + p + ".pkl");
    ASSERT_EQ(tuple.root->kind, Kind::kTuple);
    EXPECT_EQ(tuple.root->items.at(0)->items.at(0), tuple.root) << "protocol " << proto;
    UnpickleResult dict = UnpickleFile(dir + "/recursive_dict_p" + p + ".pkl");
    EXPECT_EQ(DictGet(dict.root, "self"), dict.root);
  }
}

TEST(PlainPickles, IntegersBeyondInt64AreBigInts) {
  REQUIRE_PLAIN_DIR(dir);
  for (int proto = 0; proto <= 5; ++proto) {
    UnpickleResult r = UnpickleFile(dir + "/ints_p" + std::to_string(proto) + ".pkl");
    const auto& v = r.root->items;
    ASSERT_EQ(v.size(), 20u);
    EXPECT_EQ(v[11]->kind, Kind::kInt);  // 2**63 - 1
    EXPECT_EQ(v[11]->integer, INT64_MAX);
    EXPECT_EQ(v[12]->kind, Kind::kInt);  // -2**63
    EXPECT_EQ(v[12]->integer, INT64_MIN);
    EXPECT_EQ(v[13]->kind, Kind::kBigInt);  // 2**63
    EXPECT_EQ(v[13]->text, std::string("\x00\x00\x00\x00\x00\x00\x00\x80\x00", 9));
    EXPECT_EQ(v[14]->kind, Kind::kBigInt);  // -2**63 - 1
  }
}

TEST(PlainPickles, BytesIdiomsBecomeBytes) {
  REQUIRE_PLAIN_DIR(dir);
  for (int proto = 0; proto <= 5; ++proto) {
    std::string p = std::to_string(proto);
    UnpickleResult bytes = UnpickleFile(dir + "/bytes_p" + p + ".pkl");
    ASSERT_EQ(bytes.root->items.size(), 4u);
    EXPECT_EQ(bytes.root->items[2]->kind, Kind::kBytes);
    EXPECT_EQ(bytes.root->items[2]->text.size(), 256u);
    EXPECT_FALSE(bytes.root->items[2]->bytearray);
    UnpickleResult arrays = UnpickleFile(dir + "/bytearrays_p" + p + ".pkl");
    EXPECT_TRUE(arrays.root->items.at(0)->bytearray) << "protocol " << proto;
    UnpickleResult sets = UnpickleFile(dir + "/sets_p" + p + ".pkl");
    EXPECT_EQ(sets.root->items.at(0)->kind, Kind::kSet);
    EXPECT_EQ(sets.root->items.at(1)->kind, Kind::kFrozenSet);
  }
}

TEST(Unpickler, CodecsEncodeWithLatin1FoldsToBytes) {
  // _codecs.encode('aÿ', 'latin1') as protocol 2 writes bytes.
  auto b = PickleBuilder().Proto(2).Global("_codecs", "encode").Unicode("a\xc3\xbf").Unicode("latin1")
               .Op(0x86).Op('R').Stop();
  UnpickleResult r = Unpickle(b.bytes());
  ASSERT_EQ(r.root->kind, Kind::kBytes);
  EXPECT_EQ(r.root->text, "a\xff");
  EXPECT_EQ(Render(r.root), "b'a\\xff'");
}

TEST(Unpickler, OddDataConstructorArgumentsStayObjects) {
  // A code point above 0xFF cannot be latin-1: Python would raise, so it stays a call.
  auto b = PickleBuilder().Proto(2).Global("_codecs", "encode").Unicode("\xe2\x82\xac").Unicode("latin1")
               .Op(0x86).Op('R').Stop();
  UnpickleResult r = Unpickle(b.bytes());
  ASSERT_EQ(r.root->kind, Kind::kObject);
  EXPECT_EQ(Render(r.root), "_codecs.encode('\xe2\x82\xac', 'latin1')");
  // bytes(5) would allocate; it is not folded either.
  auto n = PickleBuilder().Proto(2).Global("__builtin__", "bytes").Int1(5).Op(0x85).Op('R').Stop();
  EXPECT_EQ(Render(Unpickle(n.bytes()).root), "__builtin__.bytes(5)");
  // bytearray(b'xy') and set([1, 1]) fold (members kept as listed).
  auto ba = PickleBuilder().Proto(3).Global("builtins", "bytearray").Op('C').LE(2, 1).Raw("xy").Op(0x85).Op('R').Stop();
  EXPECT_EQ(Render(Unpickle(ba.bytes()).root), "bytearray(b'xy')");
  auto s = PickleBuilder().Proto(2).Global("__builtin__", "set").Op(']').Mark().Int1(1).Int1(1).Op('e')
               .Op(0x85).Op('R').Stop();
  EXPECT_EQ(Render(Unpickle(s.bytes()).root), "{1, 1}");
}

TEST(Unpickler, CallsBecomeObjectsWithLaterState) {
  // collections.OrderedDict() + SETITEMS + BUILD {'_metadata': {}}: a module state_dict.
  auto b = PickleBuilder().Proto(2).Global("collections", "OrderedDict").Op(')').Op('R').Mark()
               .Unicode("w").Int1(1).Unicode("b").Int1(2).Op('u')
               .Op('}').Unicode("_metadata").Op('}').Op('s').Op('b').Stop();
  UnpickleResult r = Unpickle(b.bytes());
  ASSERT_EQ(r.root->kind, Kind::kObject);
  EXPECT_EQ(r.root->how, ObjectHow::kReduce);
  EXPECT_EQ(r.root->entries.size(), 2u);
  EXPECT_EQ(Render(r.root), "OrderedDict({'w': 1, 'b': 2}).__setstate__({'_metadata': {}})");

  // A class off the allowlist (mod.Cls), allowed by name as --allow-global does.
  UnpickleOptions allow_cls;
  allow_cls.allow_globals = {"mod.Cls"};
  // NEWOBJ_EX with kwargs, then APPENDS (a list subclass).
  auto n = PickleBuilder().Proto(4).StackGlobal("mod", "Cls").Int1(1).Op(0x85).Op('}').ShortUnicode("k")
               .Int1(2).Op('s').Op(0x92).Mark().Int1(7).Int1(8).Op('e').Stop();
  UnpickleResult o = Unpickle(n.bytes(), allow_cls);
  EXPECT_EQ(o.root->how, ObjectHow::kNewObjEx);
  EXPECT_EQ(Render(o.root), "mod.Cls(1, **{'k': 2}).extend([7, 8])");

  // Protocol 0 INST and protocol 1 OBJ.
  auto inst = PickleBuilder().Mark().Op('I').Raw("3\n").Inst("mod", "Cls").Stop();
  UnpickleResult i = Unpickle(inst.bytes(), allow_cls);
  EXPECT_EQ(i.root->how, ObjectHow::kInst);
  EXPECT_EQ(Render(i.root), "mod.Cls(3)");
  auto obj = PickleBuilder().Mark().Global("mod", "Cls").Int1(4).Int1(5).Op('o').Stop();
  UnpickleResult ob = Unpickle(obj.bytes(), allow_cls);
  EXPECT_EQ(ob.root->how, ObjectHow::kObj);
  EXPECT_EQ(Render(ob.root), "mod.Cls(4, 5)");
}

TEST(Unpickler, PersistentIds) {
  auto b = PickleBuilder().Proto(2).Mark().Unicode("storage").Int1(3).Op('t').Op('Q').Stop();
  UnpickleResult r = Unpickle(b.bytes());
  ASSERT_EQ(r.root->kind, Kind::kPersistentId);
  EXPECT_EQ(Render(r.root), "persid(('storage', 3))");
  UnpickleResult text = Unpickle(ToBytes("Pkey 1\n."));
  EXPECT_EQ(Render(text.root), "persid('key 1')");
  testing::ExpectUnpickleError(ToBytes("Pk\xc3\xa9\n."), ErrorKind::kCorrupt, "offset 0: persistent IDs in protocol 0 must be ASCII");
}

TEST(Unpickler, Python2StringsThatAreNotUtf8StayBytes) {
  UnpickleResult r = Unpickle(ToBytes("U\x02\xff\xfe."));
  EXPECT_EQ(r.root->kind, Kind::kBytes);
  EXPECT_EQ(Render(r.root), "b'\\xff\\xfe'");
  UnpickleResult s = Unpickle(ToBytes("S'\\xc3\\xa9'\n."));
  EXPECT_EQ(s.root->kind, Kind::kString);
  EXPECT_EQ(s.root->text, "\xc3\xa9");
}

TEST(Unpickler, GlobalsSeenWithFirstOffsets) {
  auto b = PickleBuilder().Proto(2).Global("torch", "Size").Op('0').Global("collections", "OrderedDict")
               .Op('0').Global("torch", "Size").Stop();
  UnpickleResult r = Unpickle(b.bytes());
  ASSERT_EQ(r.globals.size(), 2u);
  EXPECT_EQ(r.globals[0].module, "torch");
  EXPECT_EQ(r.globals[0].name, "Size");
  EXPECT_EQ(r.globals[0].offset, 2u);
  EXPECT_EQ(r.globals[1].module, "collections");
  EXPECT_EQ(r.globals[1].offset, 2u + 12 + 1);
  EXPECT_EQ(Render(r.root), "torch.Size");
}

TEST(Unpickler, StopsAtStopAndReportsTheEnd) {
  std::vector<uint8_t> two = ToBytes("K\x05.K\x06.");
  UnpickleResult first = Unpickle(two);
  EXPECT_EQ(first.root->integer, 5);
  EXPECT_EQ(first.end_offset, 3u);
  UnpickleResult second = Unpickle(std::span<const uint8_t>(two).subspan(first.end_offset));
  EXPECT_EQ(second.root->integer, 6);
}

TEST(Unpickler, UnsupportedFeatures) {
  testing::ExpectUnpickleError(ToBytes("\x80\x06N."), ErrorKind::kUnsupported, "offset 0: unsupported pickle protocol 6");
  testing::ExpectUnpickleError(ToBytes("\x80\x05\x97."), ErrorKind::kUnsupported, "offset 2: out-of-band buffers");
  testing::ExpectUnpickleError(ToBytes("\x80\x05N\x98."), ErrorKind::kUnsupported, "offset 3: out-of-band buffers");
  testing::ExpectUnpickleError(ToBytes("\x80\x02\x82\x07."), ErrorKind::kUnsupported, "offset 2: extension code 7");
}

TEST(Unpickler, LimitsAreEnforced) {
  std::vector<uint8_t> list = ToBytes("](K\x01K\x02K\x03K\x04" "e.");
  UnpickleOptions nodes;
  nodes.max_nodes = 3;
  testing::ExpectUnpickleError(list, ErrorKind::kCorrupt, "offset 6: more than 3 objects (max_nodes)", nodes);
  UnpickleOptions memo;
  memo.max_memo_entries = 2;
  testing::ExpectUnpickleError(ToBytes("K\x01q\x00q\x01q\x00q\x02."), ErrorKind::kCorrupt,
                               "offset 8: more than 2 memo entries", memo);
  UnpickleOptions bytes;
  bytes.max_total_bytes = 5;
  testing::ExpectUnpickleError(ToBytes("(C\x03" "abc" "C\x03" "def" "l."), ErrorKind::kCorrupt,
                               "offset 6: more than 5 bytes of str/bytes data", bytes);
  UnpickleOptions depth;
  depth.max_depth = 3;
  EXPECT_NO_THROW(Unpickle(ToBytes("]]]a\x61."), depth));  // [[[]]]: depth 3
  testing::ExpectUnpickleError(ToBytes("]]]]aaa."), ErrorKind::kCorrupt, "offset 6: nesting deeper than 3", depth);
}

TEST(Unpickler, LongValuesRenderWithinTheBudget) {
  // A 1 MB string and a 2000-byte integer: rendering stays short and fast.
  std::string text(1 << 20, 'x');
  text.replace(5, 2, "\xc3\xa9");
  UnpickleResult s = Unpickle(PickleBuilder().Proto(4).Op(0x8d).LE(text.size(), 8).Raw(text).Stop().bytes());
  EXPECT_EQ(Render(s.root, 1000, 6), "'xxxxx...'");   // cut before the two-byte character
  EXPECT_EQ(Render(s.root, 1000, 7), "'xxxxx\xc3\xa9...'");
  UnpickleResult n = Unpickle(PickleBuilder().Proto(2).Op(0x8b).LE(2000, 4).Raw(std::string(2000, '\x11')).Stop().bytes());
  EXPECT_EQ(n.root->kind, Kind::kBigInt);
  EXPECT_EQ(Render(n.root), "<2000-byte int>");
}

TEST(Unpickler, CycleAndDepthCapsInRendering) {
  // [[[[1]]]] rendered with room for two levels.
  UnpickleResult r = Unpickle(ToBytes("]]]]K\x01" "aaaa."));
  EXPECT_EQ(Render(r.root), "[[[[1]]]]");
  EXPECT_EQ(Render(r.root, 2), "[[...]]");
  EXPECT_EQ(Render(r.root, 1000, 3), "[[[...]]]");
}

}  // namespace
}  // namespace zckpt::pickle
