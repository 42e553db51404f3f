// Progress on stderr, in one of two forms: a bar redrawn in place with throughput (a terminal),
// or one line per 10% step (a batch job's log, where a redrawn line is noise). Which one is
// chosen per command by --progress auto|always|never (default $ZCKPT_PROGRESS, else auto).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace zckpt::cli {

enum class ProgressStyle {
  kNone,
  kBar,    // "\r"-redrawn line, ~10 times a second
  kLines,  // "LABEL: 30% (1.20 GiB of 4.00 GiB, 850.00 MiB/s)" at each 10% step
};

// The style for a --progress value ("" or nullopt: $ZCKPT_PROGRESS, else "auto"):
//   auto    the bar when stderr is a terminal and $ZCKPT_NO_PROGRESS is unset, else nothing
//   always  the bar on a terminal, lines otherwise
//   never   nothing
// nullopt for any other value (a usage error).
std::optional<ProgressStyle> ChooseProgressStyle(const std::optional<std::string>& value);
// The option's help line, shared by the commands that take it.
inline constexpr const char* kProgressHelp =
    "  --progress WHEN        auto (default, or $ZCKPT_PROGRESS): a bar when stderr is a\n"
    "                         terminal; always: the bar, or one line per 10% when stderr is\n"
    "                         not a terminal (batch logs); never\n";

class ProgressBar {
 public:
  // `label` prefixes the bar ("verify model.zckpt"); `total` is in bytes (0 = unknown).
  ProgressBar(std::string label, uint64_t total, ProgressStyle style);
  ProgressBar(std::string label, uint64_t total, bool enabled)
      : ProgressBar(std::move(label), total, enabled ? ProgressStyle::kBar : ProgressStyle::kNone) {}
  ~ProgressBar();  // clears the bar; writes no line (a failed run must not end at "100%")

  // Thread-safe; the bar redraws at most ~10 times a second.
  void Set(uint64_t done);
  void Add(uint64_t delta);
  // For work whose size is learnt once it starts (a conversion's storage bytes).
  void SetTotal(uint64_t total) { total_.store(total, std::memory_order_relaxed); }
  // Clears the bar; in the line form, writes the 100% line if the work is complete and it has
  // not been written yet.
  void Finish();

  // True when stderr is a terminal and $ZCKPT_NO_PROGRESS is unset.
  static bool DefaultEnabled();

 private:
  void Draw(uint64_t done, bool force);
  void DrawLine(uint64_t done, bool final);

  std::string label_;
  std::atomic<uint64_t> total_;
  ProgressStyle style_;
  std::atomic<uint64_t> done_{0};
  std::mutex draw_mutex_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
  int last_step_ = -1;  // line form: the last 10% step written
};

// "1.23 GiB", "512 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace zckpt::cli
