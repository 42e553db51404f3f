// The deny list: code-running globals are refused (kUnsafe, with the opcode offset) whichever
// opcode names them, and pickles that do run code under Python stay inert here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "pickle/safety.h"
#include "pickle/unpickler.h"
#include "pickle_test_util.h"
#include "test_util.h"

namespace zckpt::pickle {
namespace {

using testing::PickleBuilder;

const std::vector<std::pair<std::string, std::string>> kRefused = {
    {"os", "system"}, {"posix", "system"}, {"nt", "system"}, {"os.path", "join"}, {"os", "popen"},
    {"subprocess", "Popen"}, {"subprocess", "check_output"}, {"builtins", "eval"}, {"builtins", "exec"},
    {"builtins", "compile"}, {"builtins", "getattr"}, {"__builtin__", "getattr"}, {"builtins", "__import__"},
    {"builtins", "open"}, {"__builtin__", "open"}, {"builtins", "globals"}, {"builtins", "breakpoint"},
    {"builtins", "setattr"}, {"builtins", "input"}, {"builtins", "vars"}, {"builtins", "type"},
    {"runpy", "_run_code"}, {"importlib", "import_module"}, {"importlib.util", "spec_from_file_location"},
    {"pickle", "loads"}, {"_pickle", "loads"}, {"cPickle", "loads"}, {"marshal", "loads"},
    {"shutil", "rmtree"}, {"socket", "create_connection"}, {"ctypes", "CDLL"}, {"code", "interact"},
    {"codeop", "compile_command"}, {"pty", "spawn"}, {"platform", "popen"}, {"webbrowser", "open"},
    {"multiprocessing", "Process"}, {"multiprocessing.context", "Process"}, {"threading", "Thread"},
    {"signal", "signal"}, {"sys", "exit"}, {"sys", "modules"}, {"torch", "load"}, {"torch", "save"},
    {"torch.hub", "load"}, {"torch.jit", "load"}, {"torch.ops", "load_library"}, {"torch._C", "_jit_pass"},
    {"torch.serialization", "load"}, {"torch.storage", "_load_from_bytes"},
    {"torch.fx.graph_module", "reduce_graph_module"}, {"numpy", "load"},
    {"numpy.testing._private.utils", "runstring"}, {"numpy.f2py", "compile"}, {"operator", "attrgetter"},
    {"operator", "methodcaller"}, {"operator", "itemgetter"}, {"_operator", "attrgetter"},
    {"functools", "partial"}, {"_io", "open"}, {"io", "open"}, {"types", "FunctionType"},
    {"types", "CodeType"}, {"commands", "getoutput"}, {"__builtin__", "reduce"}, {"thread", "start_new_thread"},
    // Dotted (protocol 4 qualified) names: an attribute walk into a refused module or a dunder.
    {"posixpath", "os.system"}, {"torch", "serialization.load"}, {"torch", "hub.load"},
    {"builtins", "set.__init__"}, {"collections", "OrderedDict.__class__"}, {"mod", "Cls.__subclasses__"},
};

const std::vector<std::pair<std::string, std::string>> kAllowed = {
    {"torch._utils", "_rebuild_tensor_v2"}, {"torch._utils", "_rebuild_parameter"},
    {"torch._tensor", "_rebuild_from_type_v2"}, {"torch", "FloatStorage"}, {"torch.storage", "UntypedStorage"},
    {"torch", "Size"}, {"torch", "device"}, {"torch", "bfloat16"}, {"torch.serialization", "_get_layout"},
    {"torch.nn.parameter", "Parameter"}, {"torch.distributed.tensor", "DTensor"},
    {"torch.distributed._shard.sharded_tensor.api", "ShardedTensor.ProcessGroupState"},
    {"collections", "OrderedDict"}, {"_codecs", "encode"}, {"builtins", "set"}, {"__builtin__", "set"},
    {"__builtin__", "bytes"}, {"builtins", "bytearray"}, {"builtins", "complex"}, {"builtins", "frozenset"},
    {"__builtin__", "long"}, {"copy_reg", "_reconstructor"}, {"copyreg", "__newobj__"},
    {"numpy.core.multiarray", "_reconstruct"}, {"numpy._core.multiarray", "scalar"}, {"numpy", "dtype"},
    {"numpy", "ndarray"}, {"types", "SimpleNamespace"}, {"__main__", "Custom"}, {"argparse", "Namespace"},
    {"operator", "add"}, {"functools", "wraps_not_partial"}, {"osmosis", "system"}, {"mymod.io", "Thing"},
};

TEST(DenyList, RefusesCodeRunningGlobals) {
  for (const auto& [module, name] : kRefused) {
    EXPECT_TRUE(IsCodeExecutionGlobal(module, name)) << module << "." << name;
    EXPECT_TRUE(RefusalReason(module, name).has_value()) << module << "." << name;
  }
}

TEST(DenyList, AllowsDataGlobals) {
  for (const auto& [module, name] : kAllowed) {
    EXPECT_FALSE(IsCodeExecutionGlobal(module, name)) << module << "." << name << ": "
                                                      << RefusalReason(module, name).value_or("");
  }
}

TEST(DenyList, ReasonsSayWhy) {
  EXPECT_NE(RefusalReason("os", "system")->find("shell"), std::string_view::npos);
  EXPECT_NE(RefusalReason("__builtin__", "getattr")->find("getattr"), std::string_view::npos);
  EXPECT_NE(RefusalReason("mod", "A.__globals__")->find("dunder"), std::string_view::npos);
}

std::string Refusal(const std::string& module, const std::string& name, size_t offset) {
  return "refused global '" + module + "." + name + "' at pickle byte offset " + std::to_string(offset);
}

void ExpectRefused(const std::vector<uint8_t>& bytes, const std::string& message) {
  Error e = testing::CatchError([&] { Unpickle(bytes); });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsafe) << e.what();
  EXPECT_EQ(std::string(e.what()), message);
}

TEST(DenyList, RefusedThroughGlobalStackGlobalAndInst) {
  for (const auto& [module, name] : kRefused) {
    // GLOBAL after a PROTO and a NONE: offset 3.
    ExpectRefused(PickleBuilder().Proto(2).Op('N').Global(module, name).Op('N').Op('R').Stop().bytes(),
                  Refusal(module, name, 3));
    // STACK_GLOBAL: the offset of the 0x93 opcode, after two strings.
    PickleBuilder sg;
    sg.Proto(4).StackGlobal(module, name).Op(')').Op('R').Stop();
    ExpectRefused(sg.bytes(), Refusal(module, name, 2 + (2 + module.size()) + (2 + name.size())));
    // INST (protocol 0) after MARK and an argument: offset 4.
    ExpectRefused(PickleBuilder().Mark().Op('I').Raw("1\n").Inst(module, name).Stop().bytes(), Refusal(module, name, 4));
  }
}

TEST(DenyList, AllowedGlobalsBecomeOpaqueNodes) {
  UnpickleOptions describe;
  describe.globals = GlobalPolicy::kDenyListOnly;
  for (const auto& [module, name] : kAllowed) {
    UnpickleResult r = Unpickle(PickleBuilder().Proto(4).StackGlobal(module, name).Stop().bytes(), describe);
    ASSERT_EQ(r.root->kind, Kind::kGlobal);
    EXPECT_EQ(r.root->text, module);
    EXPECT_EQ(r.root->name, name);
  }
}

TEST(DenyList, RefusalStopsAtTheFirstRefusedGlobal) {
  // An allowed global first, then a refused one: the offset is the refused one's.
  auto b = PickleBuilder().Proto(2).Global("collections", "OrderedDict").Op('0').Global("os", "system").Stop();
  ExpectRefused(b.bytes(), Refusal("os", "system", 2 + 25 + 1));
}

// Changes the working directory for the lifetime of the object.
class ScopedCwd {
 public:
  explicit ScopedCwd(const std::string& dir) {
    char buf[PATH_MAX];
    old_ = getcwd(buf, sizeof buf) ? buf : "/";
    EXPECT_EQ(chdir(dir.c_str()), 0);
  }
  ~ScopedCwd() { EXPECT_EQ(chdir(old_.c_str()), 0); }

 private:
  std::string old_;
};

TEST(Hostile, PicklesThatRunCodeUnderPythonAreRefusedAndInert) {
  if (zckpt::testing::TestPython().empty()) GTEST_SKIP() << "no Python";
  std::string dir = testing::FixtureDir("tests/pickle/make_hostile_pickles.py");
  ASSERT_FALSE(dir.empty());
  auto rows = testing::ReadTable(dir + "/hostile.txt");
  ASSERT_GE(rows.size(), 12u);
  zckpt::testing::TempDir scratch;
  {
    ScopedCwd in(scratch.path());
    for (const auto& row : rows) {
      ASSERT_EQ(row.size(), 4u);
      EXPECT_EQ(row[3], "1") << row[0] << ": Python did not create the marker, so the fixture proves nothing";
      Error e = testing::CatchError([&] { Unpickle(testing::ReadBytes(dir + "/" + row[0])); });
      EXPECT_EQ(e.kind(), ErrorKind::kUnsafe) << row[0] << ": " << e.what();
      EXPECT_EQ(std::string(e.what()), "refused global '" + row[1] + "' at pickle byte offset " + row[2]) << row[0];
    }
  }
  EXPECT_FALSE(zckpt::testing::FileExists(scratch.File("zckpt_marker")));
  EXPECT_FALSE(zckpt::testing::FileExists(dir + "/zckpt_marker"));
}

}  // namespace
}  // namespace zckpt::pickle
