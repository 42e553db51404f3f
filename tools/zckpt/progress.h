// A one-line progress bar with throughput, drawn on stderr only when stderr is a terminal,
// so scripts and CI logs get clean output and people watching a 30 GiB job get feedback.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace zckpt::cli {

class ProgressBar {
 public:
  // `label` prefixes the bar ("verify model.zckpt"); `total` is in bytes (0 = unknown).
  ProgressBar(std::string label, uint64_t total, bool enabled);
  ~ProgressBar();  // clears the line

  // Thread-safe; redraws at most ~10 times a second.
  void Set(uint64_t done);
  void Add(uint64_t delta);
  void Finish();

  // True when stderr is a terminal and $ZCKPT_NO_PROGRESS is unset.
  static bool DefaultEnabled();

 private:
  void Draw(uint64_t done, bool force);

  std::string label_;
  uint64_t total_;
  bool enabled_;
  std::atomic<uint64_t> done_{0};
  std::mutex draw_mutex_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
};

// "1.23 GiB", "512 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace zckpt::cli
