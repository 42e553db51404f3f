// Shared pieces of the `zckpt` subcommands: exit codes, option parsing, error reporting.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zckpt/error.h"

namespace zckpt::cli {

// Exit codes every subcommand uses, so scripts can act on them.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBad = 1;        // a file is corrupt, unsafe or otherwise refused
inline constexpr int kExitCannotRun = 2;  // usage error, missing file, not a container, I/O

// Exit code for an error raised while working on a file.
int ExitCodeFor(const Error& e);

// A small getopt-like parser: `--name VALUE`, `--name=VALUE`, `-x VALUE`, boolean flags, and
// positional arguments. Unknown options are a usage error.
class Args {
 public:
  // `flags`: options without a value; `options`: options taking one. Short aliases map to long.
  Args(const std::vector<std::string>& argv, const std::vector<std::string>& flags,
       const std::vector<std::string>& options, const std::map<std::string, std::string>& aliases = {});
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  bool Has(const std::string& name) const;
  std::optional<std::string> Get(const std::string& name) const;  // the last one given
  // Every value of an option that may repeat (--allow-global A --allow-global B), in order.
  std::vector<std::string> GetAll(const std::string& name) const;
  // Parses an integer option with optional K/M/G suffix (binary); sets error() on failure.
  std::optional<uint64_t> GetSize(const std::string& name);
  std::optional<int64_t> GetInt(const std::string& name);
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_values_;
  std::vector<std::string> positional_;
  std::string error_;
};

// True when `a` and `b` name the same file however spelled (./x, /abs/x, a symlink), so a
// command never writes over the file it reads.
bool SameFile(const std::string& a, const std::string& b);

// The folder of the running executable ("" when /proc is unavailable): where `zckpt reshard`
// finds, in a build tree or a wheel, the Python package.
std::string SelfDir();

// An option given by a deprecated spelling (kept working for one release): when `key` was given,
// prints "zckpt CMD: OLD is deprecated: ADVICE" to stderr.
void WarnDeprecated(const Args& args, const std::string& command, const std::string& key, const std::string& old_spelling,
                    const std::string& advice);

// Prints "zckpt CMD: message" to stderr and returns kExitCannotRun.
int UsageError(const std::string& command, const std::string& message);

// Help text of --allow-global, shared by convert, export, merge and load.
inline constexpr const char* kAllowGlobalHelp =
    "  --allow-global MOD.NAME  let the pickle name this global besides zckpt's allowlist of\n"
    "                         data globals (torch's tensors, storages and dtypes, collections,\n"
    "                         numpy arrays, DTensor/ShardedTensor metadata, ...): a class of your\n"
    "                         own, in a file you trust. Repeat for several. Globals that could run\n"
    "                         code (os.system, eval, ...) stay refused.\n";

// When `path`'s extension names a file format other than `writes` (".zckpt", ".pt", ...): a
// message saying so, for a UsageError; "" otherwise (the expected extension, or one that names
// no known format). A container called .pt, or a torch.save file called .npz, misleads every
// tool that goes by the name.
std::string MisleadingExtension(const std::string& path, const std::string& writes, const std::string& what);

// No-clobber: something exists at `path` (a file, a folder, a dangling symlink).
bool Exists(const std::string& path);
// Names the destinations that exist (the first ten) and returns UsageError: nothing was written,
// --force overwrites.
int RefuseExisting(const std::string& command, const std::vector<std::string>& existing);

}  // namespace zckpt::cli
