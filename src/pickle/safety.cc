#include "pickle/safety.h"

#include <string>
#include <vector>

#include "pickle/allowlist.h"

namespace zckpt::pickle {

namespace {

// A refused dotted path: the global `module.name` is refused when its full path equals `path`
// or lies below it ("os" refuses os.system and os.path.join; "torch.load" only torch.load and
// attributes of it).
struct Rule {
  std::string_view path;
  std::string_view why;
};

// clang-format off
constexpr Rule kDenied[] = {
  // --- Processes, shells, the interpreter itself -------------------------------------------
  {"os",                 "os: processes, shell commands, files, environment"},
  {"posix",              "posix: os.system and friends under their C module name"},
  {"nt",                 "nt: os.system and friends on Windows"},
  {"sys",                "sys: interpreter state, module table, hooks"},
  {"subprocess",         "subprocess: runs programs"},
  {"_posixsubprocess",   "_posixsubprocess: fork/exec"},
  {"popen2",             "popen2 (Python 2): runs programs"},
  {"pty",                "pty: spawns processes"},
  {"platform",           "platform: runs helper programs"},
  {"signal",             "signal: installs handlers"},
  {"atexit",             "atexit: registers callables"},
  {"multiprocessing",    "multiprocessing: starts processes, unpickles"},
  {"_multiprocessing",   "_multiprocessing: process plumbing"},
  {"threading",          "threading: runs callables on threads"},
  {"_thread",            "_thread: start_new_thread runs callables"},
  {"_dummy_thread",      "_dummy_thread: runs callables"},
  {"concurrent",         "concurrent.futures: runs callables"},
  {"asyncio",            "asyncio: subprocesses, callbacks"},
  {"webbrowser",         "webbrowser: launches programs"},
  {"uuid",               "uuid: _get_command_stdout and the getnode helpers run programs"},
  {"imaplib",            "imaplib: IMAP4_stream runs a shell command"},
  {"_osx_support",       "_osx_support: _read_output runs shell commands"},
  {"_aix_support",       "_aix_support: runs helper programs"},
  {"pipes",              "pipes: builds and runs shell pipelines"},
  {"_winapi",            "_winapi: CreateProcess"},
  {"idlelib",            "idlelib: runs code and subprocesses"},
  // --- Evaluating code, importing, resolving names ----------------------------------------
  {"builtins",           "builtins: eval/exec/compile/getattr/__import__/open/... (data constructors are allowed below)"},
  {"runpy",              "runpy: runs modules and code"},
  {"importlib",          "importlib: imports arbitrary modules"},
  {"imp",                "imp: imports and loads modules"},
  {"zipimport",          "zipimport: imports modules"},
  {"pkgutil",            "pkgutil: resolve_name imports and walks attributes"},
  {"pydoc",              "pydoc: locate() imports, pagers run shell commands"},
  {"site",               "site: runs .pth files"},
  {"code",               "code: interactive interpreters run source"},
  {"codeop",             "codeop: compiles source"},
  {"pdb",                "pdb: run() executes source"},
  {"bdb",                "bdb: run() executes source"},
  {"trace",              "trace: runs code"},
  {"profile",            "profile: run() executes source"},
  {"cProfile",           "cProfile: run() executes source"},
  {"timeit",             "timeit: executes source strings"},
  {"doctest",            "doctest: executes docstrings"},
  {"inspect",            "inspect: reaches frames and attributes"},
  {"gc",                 "gc: reaches every live object"},
  {"marshal",            "marshal: loads code objects"},
  {"types",              "types: FunctionType/CodeType/MethodType build callables (SimpleNamespace allowed below)"},
  {"operator.attrgetter",   "attrgetter: attribute walks, the classic getattr substitute"},
  {"operator.methodcaller", "methodcaller: calls any method"},
  {"operator.itemgetter",   "itemgetter: a callable factory used in gadget chains"},
  {"operator.call",         "operator.call: calls anything"},
  {"_operator.attrgetter",  "attrgetter (C module)"},
  {"_operator.methodcaller","methodcaller (C module)"},
  {"_operator.itemgetter",  "itemgetter (C module)"},
  {"_operator.call",        "operator.call (C module)"},
  {"functools.partial",     "partial: binds callables for later calls"},
  {"functools.partialmethod","partialmethod: binds callables"},
  {"functools.reduce",      "reduce: calls a callable repeatedly"},
  {"_functools",            "_functools: partial/reduce (C module)"},
  {"logging.config",        "logging.config: listen() and fileConfig evaluate text"},
  {"ctypes",             "ctypes: calls native code"},
  {"_ctypes",            "_ctypes: calls native code"},
  {"cffi",               "cffi: calls native code"},
  // --- Nested unpicklers and serializers (they would unpickle without this list) ----------
  {"pickle",             "pickle: nested loads() bypasses this list"},
  {"_pickle",            "_pickle: nested loads()"},
  {"shelve",             "shelve: unpickles files"},
  {"dill",               "dill: unpickles code"},
  {"cloudpickle",        "cloudpickle: unpickles code"},
  {"joblib",             "joblib: unpickles files"},
  // --- Files and the network ---------------------------------------------------------------
  {"io",                 "io: opens files"},
  {"logging",            "logging: handlers open files and sockets"},
  {"zipfile",            "zipfile: opens and writes files"},
  {"tarfile",            "tarfile: opens, writes and extracts files"},
  {"gzip",               "gzip: opens files"},
  {"bz2",                "bz2: opens files"},
  {"lzma",               "lzma: opens files"},
  {"sqlite3",            "sqlite3: opens database files"},
  {"dbm",                "dbm: opens database files"},
  {"socketserver",       "socketserver: listens on sockets"},
  {"_io",                "_io: opens files"},
  {"codecs.open",        "codecs.open: opens files"},
  {"shutil",             "shutil: copies, moves and deletes files"},
  {"tempfile",           "tempfile: creates files"},
  {"socket",             "socket: network access"},
  {"_socket",            "_socket: network access"},
  {"ssl",                "ssl: network access"},
  {"http",               "http: servers and clients"},
  {"urllib.request",     "urllib.request: fetches URLs"},
  {"ftplib",             "ftplib: network access"},
  {"smtplib",            "smtplib: network access"},
  {"telnetlib",          "telnetlib: network access"},
  {"xmlrpc",             "xmlrpc: remote calls"},
  {"requests",           "requests: network access"},
  // --- Build and packaging tools (compile and run code) -----------------------------------
  {"distutils",          "distutils: compiles and runs code"},
  {"setuptools",         "setuptools: runs setup code"},
  {"pip",                "pip: installs and runs code"},
  {"ensurepip",          "ensurepip: installs packages"},
  {"venv",               "venv: creates environments, runs pip"},
  // --- torch entry points that load, compile or call out ----------------------------------
  {"torch.load",         "torch.load: nested unpickling"},
  {"torch.save",         "torch.save: writes files"},
  {"torch.hub",          "torch.hub: downloads and runs repositories"},
  {"torch.jit",          "torch.jit: loads and compiles TorchScript"},
  {"torch.ops",          "torch.ops: calls any registered operator, load_library loads .so files"},
  {"torch._ops",         "torch._ops: operator dispatch"},
  {"torch._C",           "torch._C: native hooks"},
  {"torch.classes",      "torch.classes: loads native libraries"},
  {"torch._classes",     "torch._classes: loads native libraries"},
  {"torch.library",      "torch.library: registers operators"},
  {"torch._library",     "torch._library: registers operators"},
  {"torch.package",      "torch.package: imports packaged code"},
  {"torch.fx",           "torch.fx: GraphModule unpickling executes generated source"},
  {"torch._dynamo",      "torch._dynamo: compiles and runs code"},
  {"torch._inductor",    "torch._inductor: compiles and loads code"},
  {"torch.compile",      "torch.compile: compiles code"},
  {"torch.multiprocessing", "torch.multiprocessing: starts processes"},
  {"torch.distributed.rpc", "torch.distributed.rpc: remote calls"},
  {"torch.utils.cpp_extension", "cpp_extension: compiles and loads native code"},
  {"torch.utils.collect_env",   "collect_env: runs programs"},
  {"torch.utils.benchmark",     "torch.utils.benchmark: Timer compiles and runs statements (C++ ones through a compiler)"},
  {"torch.utils.tensorboard",   "torch.utils.tensorboard: SummaryWriter creates files"},
  {"torch.cuda.memory",         "torch.cuda.memory: _dump_snapshot writes files, _record_memory_history installs hooks"},
  {"torch.serialization",       "torch.serialization: load/save and friends (_get_layout allowed below)"},
  {"torch.storage._load_from_bytes", "_load_from_bytes: nested torch.load"},
  {"torch._utils._import_dotted_name", "_import_dotted_name: imports any module"},
  // --- numpy entry points that load pickles or compile code -------------------------------
  {"numpy.load",         "numpy.load: may unpickle"},
  {"numpy.save",         "numpy.save: writes files"},
  {"numpy.savez",        "numpy.savez: writes files"},
  {"numpy.savez_compressed", "numpy.savez_compressed: writes files"},
  {"numpy.savetxt",      "numpy.savetxt: writes text files"},
  {"numpy.loadtxt",      "numpy.loadtxt: reads files"},
  {"numpy.genfromtxt",   "numpy.genfromtxt: reads files"},
  {"numpy.fromfile",     "numpy.fromfile: reads files"},
  {"numpy.fromregex",    "numpy.fromregex: reads files"},
  {"numpy.memmap",       "numpy.memmap: creates and maps files"},
  {"numpy.lib.npyio",    "numpy.lib.npyio: load/loadtxt may unpickle"},
  {"numpy.lib._npyio_impl", "numpy.lib._npyio_impl: load may unpickle"},
  {"numpy.lib.format",   "numpy.lib.format: read_array may unpickle"},
  {"numpy.testing",      "numpy.testing: runstring executes source"},
  {"numpy.f2py",         "numpy.f2py: compiles and runs Fortran wrappers"},
  {"numpy.distutils",    "numpy.distutils: compiles code"},
  {"numpy.ctypeslib",    "numpy.ctypeslib: loads native libraries"},
};

// Exceptions inside the refused areas above: pure data constructors and harmless helpers that
// real checkpoints use. Exact paths only.
constexpr std::string_view kAllowed[] = {
  "builtins.set", "builtins.frozenset", "builtins.bytes", "builtins.bytearray", "builtins.complex",
  "builtins.slice", "builtins.range", "builtins.int", "builtins.float", "builtins.str",
  "builtins.list", "builtins.dict", "builtins.tuple", "builtins.object", "builtins.bool",
  "builtins.Ellipsis", "builtins.NotImplemented",
  "types.SimpleNamespace",
  "torch.serialization._get_layout",
  "uuid.UUID", "uuid.SafeUUID",
};

// Python 2 module names that Python 3's unpickler maps (Lib/_compat_pickle.py) onto a module
// judged above: a pickle must not get past the list by spelling a module the old way.
struct Alias {
  std::string_view from;
  std::string_view to;
};
constexpr Alias kModuleAliases[] = {
  {"__builtin__", "builtins"}, {"copy_reg", "copyreg"}, {"commands", "subprocess"},
  {"thread", "_thread"}, {"dummy_thread", "_dummy_thread"}, {"cPickle", "pickle"},
  {"StringIO", "io"}, {"cStringIO", "io"}, {"SimpleHTTPServer", "http.server"},
  {"CGIHTTPServer", "http.server"}, {"BaseHTTPServer", "http.server"}, {"httplib", "http.client"},
  {"urllib2", "urllib.request"}, {"xmlrpclib", "xmlrpc.client"},
  {"SimpleXMLRPCServer", "xmlrpc.server"}, {"SocketServer", "socketserver"},
};
// Whole (module, name) renames of the same table that leave the module.
struct NameAlias {
  std::string_view from;
  std::string_view to;
};
constexpr NameAlias kNameAliases[] = {
  {"__builtin__.reduce", "functools.reduce"}, {"__builtin__.intern", "sys.intern"},
  {"__builtin__.xrange", "builtins.range"}, {"__builtin__.unicode", "builtins.str"},
  {"__builtin__.long", "builtins.int"}, {"__builtin__.unichr", "builtins.chr"},
  {"__builtin__.basestring", "builtins.str"}, {"itertools.imap", "builtins.map"},
  {"itertools.izip", "builtins.zip"}, {"itertools.ifilter", "builtins.filter"},
  {"urllib.urlopen", "urllib.request.urlopen"}, {"urllib.urlretrieve", "urllib.request.urlretrieve"},
  {"_socket.fromfd", "socket.fromfd"},
};
// clang-format on

bool AtOrBelow(std::string_view path, std::string_view root) {
  return path == root || (path.size() > root.size() && path.substr(0, root.size()) == root && path[root.size()] == '.');
}

bool IsAllowed(std::string_view path) {
  for (std::string_view a : kAllowed)
    if (path == a) return true;
  return false;
}

std::optional<std::string_view> DeniedPath(std::string_view path) {
  if (IsAllowed(path)) return std::nullopt;
  for (const Rule& r : kDenied)
    if (AtOrBelow(path, r.path)) return r.why;
  return std::nullopt;
}

std::vector<std::string_view> SplitDots(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

}  // namespace

std::string CanonicalGlobalPath(std::string_view module, std::string_view name) {
  std::string path = std::string(module) + "." + std::string(name);
  for (const NameAlias& a : kNameAliases)
    if (path == a.from) return std::string(a.to);
  for (const Alias& a : kModuleAliases)
    if (module == a.from) return std::string(a.to) + "." + std::string(name);
  if (module == "torch.tensor") return "torch._tensor." + std::string(name);  // torch.load's own rename
  return path;
}

std::optional<std::string_view> RefusalReason(std::string_view module, std::string_view name) {
  if (module.empty() || name.empty()) return "empty module or name";
  std::string written = std::string(module) + "." + std::string(name);
  std::string canonical = CanonicalGlobalPath(module, name);
  for (const std::string& path : {written, canonical})
    if (auto why = DeniedPath(path)) return why;
  // A dotted name walks attributes after the import (protocol 4 qualified names): a walk
  // through a dunder reaches anything, and a walk through a re-exported module (posixpath's
  // `os`) is judged as that module.
  std::vector<std::string_view> parts = SplitDots(name);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts.size() > 1 && parts[i].substr(0, 2) == "__") return "attribute walk through a dunder name";
    if (parts[i].empty()) return "empty component in a dotted name";
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    std::string_view rest = name.substr(static_cast<size_t>(parts[i].data() - name.data()));
    if (auto why = DeniedPath(rest)) return why;
  }
  return std::nullopt;
}

bool IsCodeExecutionGlobal(std::string_view module, std::string_view name) {
  return RefusalReason(module, name).has_value();
}

GlobalVetter::GlobalVetter(GlobalPolicy policy, const std::vector<std::string>& allowed)
    : policy_(policy), allowed_(allowed.begin(), allowed.end()) {}

std::optional<std::string> GlobalVetter::Refusal(std::string_view module, std::string_view name) const {
  if (auto why = RefusalReason(module, name)) return std::string(*why);
  if (policy_ == GlobalPolicy::kDenyListOnly) return std::nullopt;
  std::string written = std::string(module) + "." + std::string(name);
  std::string canonical = CanonicalGlobalPath(module, name);
  if (IsDataGlobal(canonical) || allowed_.count(written) || allowed_.count(canonical)) return std::nullopt;
  return "not on zckpt's allowlist of data globals; if the file is trusted, allow it by name (--allow-global " +
         written + ", or allow_globals=['" + written + "'] in Python)";
}

}  // namespace zckpt::pickle
