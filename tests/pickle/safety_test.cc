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
    // Missed by the list before: process-spawning stdlib helpers, torch's benchmark Timer
    // (compiles and runs statements), numpy's file writers.
    {"imaplib", "IMAP4_stream"}, {"uuid", "_get_command_stdout"}, {"_osx_support", "_read_output"},
    {"_aix_support", "aix_platform"}, {"pipes", "Template"}, {"subprocess", "run"}, {"pty", "fork"},
    {"torch.utils.benchmark", "Timer"}, {"torch.utils.benchmark.utils.timer", "Timer"},
    {"torch.utils.benchmark.utils.valgrind_wrapper.timer_interface", "wrapper_singleton"},
    {"numpy", "savetxt"}, {"numpy", "save"}, {"numpy", "savez"}, {"numpy", "memmap"}, {"numpy", "fromfile"},
    {"torch.utils.tensorboard", "SummaryWriter"}, {"logging", "FileHandler"}, {"zipfile", "ZipFile"},
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

void ExpectRefused(const std::vector<uint8_t>& bytes, const std::string& message, const UnpickleOptions& options = {}) {
  Error e = testing::CatchError([&] { Unpickle(bytes, options); });
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

// What the torch family (tests/fixtures/torch_family.py) names and torch's weights-only
// allowlist holds: all data.
const std::vector<std::pair<std::string, std::string>> kDataGlobals = {
    {"collections", "OrderedDict"}, {"collections", "Counter"}, {"_codecs", "encode"}, {"builtins", "set"},
    {"__builtin__", "set"}, {"__builtin__", "frozenset"}, {"__builtin__", "bytes"}, {"__builtin__", "bytearray"},
    {"builtins", "complex"}, {"copy_reg", "_reconstructor"}, {"torch", "FloatStorage"}, {"torch", "QUInt8Storage"},
    {"torch.cuda", "HalfStorage"}, {"torch", "LongTensor"}, {"torch.cuda.sparse", "FloatTensor"},
    {"torch.storage", "UntypedStorage"}, {"torch.storage", "TypedStorage"}, {"torch", "Size"}, {"torch", "Tensor"},
    {"torch", "device"}, {"torch", "bfloat16"}, {"torch", "float8_e4m3fn"}, {"torch", "uint4"}, {"torch", "bits8"},
    {"torch", "complex32"}, {"torch", "per_channel_affine"}, {"torch.serialization", "_get_layout"},
    {"torch._utils", "_rebuild_tensor_v2"}, {"torch._utils", "_rebuild_tensor_v3"}, {"torch._utils", "_rebuild_qtensor"},
    {"torch._utils", "_rebuild_parameter_with_state"}, {"torch._utils", "_rebuild_sparse_tensor"},
    {"torch._utils", "_rebuild_nested_tensor"}, {"torch._utils", "_rebuild_meta_tensor_no_storage"},
    {"torch._utils", "_rebuild_wrapper_subclass"}, {"torch._tensor", "_rebuild_from_type_v2"},
    {"torch.tensor", "_rebuild_from_type"},  // torch.load reads torch.tensor as torch._tensor
    {"torch.nn.parameter", "Parameter"}, {"torch.nn.modules.linear", "Linear"},
    {"torch.nn.modules.container", "Sequential"}, {"numpy", "ndarray"}, {"numpy", "dtype"},
    {"numpy._core.multiarray", "_reconstruct"}, {"numpy.core.multiarray", "scalar"},
    {"torch.distributed.tensor", "DTensor"}, {"torch.distributed.tensor._dtensor_spec", "DTensorSpec"},
    {"torch.distributed.tensor.placement_types", "Shard"}, {"torch.distributed.device_mesh", "DeviceMesh"},
    {"torch.distributed._mesh_layout", "_MeshLayout"},
    {"torch.distributed._shard.sharded_tensor.api", "ShardedTensor.ProcessGroupState"},
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"},
    {"torch.distributed.remote_device", "_remote_device"},
};

// Not code-running (the deny list lets them through) but not known to be data either.
const std::vector<std::pair<std::string, std::string>> kUnknown = {
    {"__main__", "Custom"}, {"mymod", "Thing"}, {"argparse", "ArgumentParser"}, {"collections", "namedtuple"},
    {"numpy.random", "seed"}, {"torch.nn.functional", "relu"}, {"torch", "manual_seed"},
    {"torch.nn.modules.module", "register_module_forward_hook"},  // a function beside the classes
    {"torch", "FancyStorage"}, {"torch.sparse", "FloatStorage"}, {"torch.optim", "Adam"},
    {"collections", "OrderedDict.Inner"},
};

TEST(AllowList, DataGlobalsPass) {
  for (const auto& [module, name] : kDataGlobals) {
    UnpickleResult r = Unpickle(PickleBuilder().Proto(4).StackGlobal(module, name).Stop().bytes());
    EXPECT_EQ(r.root->kind, Kind::kGlobal) << module << "." << name;
  }
}

TEST(AllowList, AnyOtherGlobalIsRefusedByNameAndOffsetUnlessAllowed) {
  for (const auto& [module, name] : kUnknown) {
    const std::string path = module + "." + name;
    auto bytes = PickleBuilder().Proto(2).Op('N').Global(module, name).Op('N').Op('R').Stop().bytes();
    Error e = testing::CatchError([&] { Unpickle(bytes); });
    EXPECT_EQ(e.kind(), ErrorKind::kUnsafe) << path;
    EXPECT_EQ(std::string(e.what()).rfind(Refusal(module, name, 3) + ": not on zckpt's allowlist", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("--allow-global " + path), std::string::npos) << e.what();
    UnpickleOptions allow;
    allow.allow_globals = {"other.Thing", path};
    EXPECT_EQ(Unpickle(bytes, allow).root->kind, Kind::kObject) << path;
    UnpickleOptions describe;
    describe.globals = GlobalPolicy::kDenyListOnly;
    EXPECT_EQ(Unpickle(bytes, describe).root->kind, Kind::kObject) << path;
  }
  // Allowing one name allows no other.
  UnpickleOptions allow;
  allow.allow_globals = {"mymod.Thing"};
  testing::ExpectUnpickleError(PickleBuilder().Proto(2).Global("mymod", "Other").Stop().bytes(), ErrorKind::kUnsafe,
                               "refused global 'mymod.Other'", allow);
}

TEST(AllowList, TheCallersPermissionNeverOverridesTheDenyList) {
  UnpickleOptions allow;
  for (const auto& [module, name] : kRefused) allow.allow_globals.push_back(module + "." + name);
  for (const auto& [module, name] : kRefused)
    ExpectRefused(PickleBuilder().Proto(2).Op('N').Global(module, name).Op('N').Op('R').Stop().bytes(),
                  Refusal(module, name, 3), allow);
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
  ASSERT_GE(rows.size(), 16u);
  zckpt::testing::TempDir scratch;
  {
    ScopedCwd in(scratch.path());
    UnpickleOptions defaults;   // the allowlist refuses them (as deny-listed: the short message)
    UnpickleOptions deny_only;  // the second line alone refuses every one of them too
    deny_only.globals = GlobalPolicy::kDenyListOnly;
    UnpickleOptions allowed;    // and the caller's permission does not override it
    for (const auto& row : rows) allowed.allow_globals.push_back(row[1]);
    for (const auto& row : rows) {
      ASSERT_EQ(row.size(), 4u);
      EXPECT_EQ(row[3], "1") << row[0] << ": Python did not create the marker, so the fixture proves nothing";
      for (const UnpickleOptions* options : {&defaults, &deny_only, &allowed}) {
        Error e = testing::CatchError([&] { Unpickle(testing::ReadBytes(dir + "/" + row[0]), *options); });
        EXPECT_EQ(e.kind(), ErrorKind::kUnsafe) << row[0] << ": " << e.what();
        EXPECT_EQ(std::string(e.what()), "refused global '" + row[1] + "' at pickle byte offset " + row[2]) << row[0];
      }
    }
  }
  EXPECT_FALSE(zckpt::testing::FileExists(scratch.File("zckpt_marker")));
  EXPECT_FALSE(zckpt::testing::FileExists(dir + "/zckpt_marker"));
}

}  // namespace
}  // namespace zckpt::pickle
