// zckpt/memory_stats.h's host figures, from /proc: torch-free, for the `zckpt load` command too.
#include <fstream>
#include <sstream>
#include <string>

#include "zckpt/memory_stats.h"

namespace zckpt {

HostMemory ReadHostMemory() {
  HostMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "VmRSS:") m.rss = kib << 10;
    if (key == "VmHWM:") m.peak = kib << 10;
  }
  return m;
}

bool ResetHostPeak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";  // "reset the peak resident set size" (proc(5))
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace zckpt
