#include "cli.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "printable.h"
#include "zckpt/object_store.h"

namespace zckpt::cli {

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string self(buf, static_cast<size_t>(n));
  auto slash = self.rfind('/');
  return slash == std::string::npos ? "" : self.substr(0, slash);
}

int ExitCodeFor(const Error& e) { return IsFinding(e.kind()) ? kExitBad : kExitCannotRun; }

Args::Args(const std::vector<std::string>& argv, const std::vector<std::string>& flags,
           const std::vector<std::string>& options, const std::map<std::string, std::string>& aliases) {
  auto is_in = [](const std::vector<std::string>& v, const std::string& s) {
    for (const auto& x : v)
      if (x == s) return true;
    return false;
  };
  bool only_positional = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string a = argv[i];
    if (only_positional || a.size() < 2 || a[0] != '-') {
      positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positional = true;
      continue;
    }
    std::string name, value;
    bool has_value = false;
    if (a.rfind("--", 0) == 0) {
      name = a.substr(2);
      size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
    } else {
      auto it = aliases.find(a.substr(1));
      if (it == aliases.end()) {
        error_ = "unknown option " + a;
        return;
      }
      name = it->second;
    }
    if (is_in(flags, name)) {
      if (has_value) {
        error_ = "option --" + name + " takes no value";
        return;
      }
      values_[name] = "1";
    } else if (is_in(options, name)) {
      if (!has_value) {
        if (i + 1 >= argv.size()) {
          error_ = "option --" + name + " needs a value";
          return;
        }
        value = argv[++i];
      }
      values_[name] = value;
      all_values_[name].push_back(value);
    } else {
      error_ = "unknown option " + a;
      return;
    }
  }
}

bool Args::Has(const std::string& name) const { return values_.count(name) > 0; }

std::optional<std::string> Args::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Args::GetAll(const std::string& name) const {
  auto it = all_values_.find(name);
  return it == all_values_.end() ? std::vector<std::string>{} : it->second;
}

std::optional<uint64_t> Args::GetSize(const std::string& name) {
  auto v = Get(name);
  if (!v) return std::nullopt;
  const std::string& s = *v;
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str() || errno != 0 || (!s.empty() && s[0] == '-')) {
    error_ = "--" + name + ": not a size: " + s;
    return std::nullopt;
  }
  std::string suffix(end);
  uint64_t mult = 1;
  if (suffix == "" || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "KiB" || suffix == "k") mult = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB") mult = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB") mult = 1ull << 30;
  else {
    error_ = "--" + name + ": unknown size suffix '" + suffix + "' (use K, M or G)";
    return std::nullopt;
  }
  if (n > UINT64_MAX / mult) {
    error_ = "--" + name + ": too large: " + s;
    return std::nullopt;
  }
  return static_cast<uint64_t>(n) * mult;
}

std::optional<int64_t> Args::GetInt(const std::string& name) {
  auto v = Get(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || errno != 0) {
    error_ = "--" + name + ": not an integer: " + *v;
    return std::nullopt;
  }
  return n;
}

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::equivalent(a, b, ec)) return true;
  auto ca = std::filesystem::weakly_canonical(a, ec);
  if (ec) return a == b;
  auto cb = std::filesystem::weakly_canonical(b, ec);
  return ec ? a == b : ca == cb;
}

void WarnDeprecated(const Args& args, const std::string& command, const std::string& key, const std::string& old_spelling,
                    const std::string& advice) {
  if (args.Has(key)) std::fprintf(stderr, "zckpt %s: %s is deprecated: %s\n", command.c_str(), old_spelling.c_str(), advice.c_str());
}

int UsageError(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "zckpt %s: %s\nTry 'zckpt %s --help'.\n", command.c_str(), Printable(message, true).c_str(),
               command.c_str());
  return kExitCannotRun;
}

std::string MisleadingExtension(const std::string& path, const std::string& writes, const std::string& what) {
  // Formats that go by their extension; a name outside this list is the caller's business.
  static const char* const kKnown[] = {".zckpt", ".pt",   ".pth", ".bin",  ".ckpt", ".safetensors", ".npz",
                                       ".npy",   ".gguf", ".distcp", ".json", ".onnx", ".h5", ".msgpack"};
  std::string ext = std::filesystem::path(path).extension().string();
  if (ext.empty() || ext == writes) return "";
  // A torch.save file is at home under any of torch's own names.
  static const char* const kTorch[] = {".pt", ".pth", ".bin", ".ckpt"};
  if (writes == ".pt")
    for (const char* t : kTorch)
      if (ext == t) return "";
  for (const char* k : kKnown)
    if (ext == k)
      return path + " names a " + ext + " file, but this writes " + what + " (" + writes +
             "); give it a " + writes + " name" + (writes == ".pt" ? " (or --format safetensors for a .safetensors one)" : "");
  return "";
}

bool Exists(const std::string& path) {
  if (IsObjectUrl(path)) return ObjectExists(path);  // s3://: a HEAD
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

int RefuseExisting(const std::string& command, const std::vector<std::string>& existing) {
  for (size_t i = 0; i < existing.size() && i < 10; ++i)
    std::fprintf(stderr, "zckpt %s: %s exists\n", command.c_str(), existing[i].c_str());
  if (existing.size() > 10) std::fprintf(stderr, "zckpt %s: ... and %zu more\n", command.c_str(), existing.size() - 10);
  return UsageError(command, std::to_string(existing.size()) +
                                 (existing.size() == 1 ? " destination exists" : " destinations exist") +
                                 "; nothing was written (--force overwrites)");
}

}  // namespace zckpt::cli
