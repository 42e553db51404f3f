#include "common/stale_temps.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <vector>

namespace zckpt {

namespace {

bool AllOf(std::string_view s, bool (*ok)(char)) {
  if (s.empty()) return false;
  for (char c : s)
    if (!ok(c)) return false;
  return true;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f'); }

// kill(pid, 0) fails with ESRCH only when no such process exists (EPERM: it exists, not ours).
bool PidIsAlive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno != ESRCH); }

}  // namespace

std::string TempName(const std::string& base, pid_t pid, unsigned long long random) {
  char suffix[48];
  std::snprintf(suffix, sizeof suffix, "%d-%016llx", static_cast<int>(pid), random);
  return "." + base + std::string(kTempMarker) + suffix;
}

bool IsTempName(std::string_view name, std::optional<pid_t>* pid) {
  if (pid) pid->reset();
  size_t at = name.rfind(kTempMarker);
  if (name.size() < 2 || name[0] != '.' || at == std::string_view::npos || at < 2) return false;
  std::string_view suffix = name.substr(at + kTempMarker.size());
  size_t dash = suffix.find('-');
  if (dash == std::string_view::npos) return AllOf(suffix, IsHex);  // before pids: RANDOM only
  std::string_view digits = suffix.substr(0, dash), random = suffix.substr(dash + 1);
  if (!AllOf(digits, IsDigit) || digits.size() > 9 || !AllOf(random, IsHex)) return false;
  if (pid) *pid = static_cast<pid_t>(std::stol(std::string(digits)));
  return true;
}

void RemoveStaleTemps(const std::string& dir, const std::string& own) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::pair<std::string, std::optional<pid_t>>> temps;
  while (const dirent* e = ::readdir(d)) {
    std::optional<pid_t> pid;
    if (e->d_name != own && IsTempName(e->d_name, &pid)) temps.emplace_back(e->d_name, pid);
  }
  const int dfd = ::dirfd(d);
  for (const auto& [name, pid] : temps) {
    int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st, named;
    // Locked by nobody, its writer dead or the file old, and the name still is this file (not
    // removed and re-created by someone else since we opened it).
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        ((pid && !PidIsAlive(*pid)) || std::time(nullptr) - st.st_mtime >= kStaleTempSeconds) &&
        ::fstatat(dfd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 && named.st_ino == st.st_ino &&
        named.st_dev == st.st_dev) {
      (void)::unlinkat(dfd, name.c_str(), 0);
    }
    ::close(fd);  // drops the lock
  }
  ::closedir(d);
}

}  // namespace zckpt
