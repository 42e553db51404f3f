#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace zckpt::cli {

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

bool ProgressBar::DefaultEnabled() {
  return isatty(STDERR_FILENO) && std::getenv("ZCKPT_NO_PROGRESS") == nullptr;
}

ProgressBar::ProgressBar(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Set(uint64_t done) {
  done_.store(done, std::memory_order_relaxed);
  Draw(done, false);
}

void ProgressBar::Add(uint64_t delta) {
  uint64_t done = done_.fetch_add(delta, std::memory_order_relaxed) + delta;
  Draw(done, false);
}

void ProgressBar::Finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(draw_mutex_);
  if (drawn_) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
  enabled_ = false;
}

void ProgressBar::Draw(uint64_t done, bool force) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(draw_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  double secs = std::chrono::duration<double>(now - start_).count();
  double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
  constexpr int kWidth = 30;
  std::string bar;
  if (total_ > 0) {
    int filled = static_cast<int>(kWidth * (static_cast<double>(done) / static_cast<double>(total_)));
    if (filled > kWidth) filled = kWidth;
    bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] ";
    char pct[16];
    std::snprintf(pct, sizeof pct, "%5.1f%% ", 100.0 * static_cast<double>(done) / static_cast<double>(total_));
    bar += pct;
  }
  std::fprintf(stderr, "\r\033[K%s %s%s / %s  %s/s", label_.c_str(), bar.c_str(), FormatBytes(done).c_str(),
               total_ ? FormatBytes(total_).c_str() : "?", FormatBytes(static_cast<uint64_t>(rate)).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace zckpt::cli
