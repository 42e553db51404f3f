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

std::optional<ProgressStyle> ChooseProgressStyle(const std::optional<std::string>& value) {
  std::string mode = value.value_or("");
  if (mode.empty()) {
    const char* env = std::getenv("ZCKPT_PROGRESS");
    mode = env && *env ? env : "auto";
  }
  if (mode == "never") return ProgressStyle::kNone;
  if (mode == "always") return isatty(STDERR_FILENO) ? ProgressStyle::kBar : ProgressStyle::kLines;
  if (mode == "auto") return ProgressBar::DefaultEnabled() ? ProgressStyle::kBar : ProgressStyle::kNone;
  return std::nullopt;
}

ProgressBar::ProgressBar(std::string label, uint64_t total, ProgressStyle style)
    : label_(std::move(label)), total_(total), style_(style),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (style_ == ProgressStyle::kLines) style_ = ProgressStyle::kNone;  // no "100%" after a failure
  Finish();
}

void ProgressBar::Set(uint64_t done) {
  done_.store(done, std::memory_order_relaxed);
  Draw(done, false);
}

void ProgressBar::Add(uint64_t delta) {
  uint64_t done = done_.fetch_add(delta, std::memory_order_relaxed) + delta;
  Draw(done, false);
}

void ProgressBar::Finish() {
  if (style_ == ProgressStyle::kNone) return;
  std::lock_guard<std::mutex> lock(draw_mutex_);
  if (style_ == ProgressStyle::kLines) {
    uint64_t done = done_.load(std::memory_order_relaxed), total = total_.load(std::memory_order_relaxed);
    if (done >= total && last_step_ < 10) DrawLine(total, true);
  } else if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
  }
  std::fflush(stderr);
  drawn_ = false;
  style_ = ProgressStyle::kNone;
}

void ProgressBar::DrawLine(uint64_t done, bool final) {
  const uint64_t total = total_.load(std::memory_order_relaxed);
  // Unknown total: no steps, only the final line.
  int step = total ? static_cast<int>(10 * static_cast<double>(done) / static_cast<double>(total)) : (final ? 10 : -1);
  if (step > 10) step = 10;
  if (step <= last_step_) return;
  last_step_ = step;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
  std::fprintf(stderr, "%s: %d%% (%s of %s, %s/s)\n", label_.c_str(), step * 10, FormatBytes(done).c_str(),
               total || final ? FormatBytes(total).c_str() : "?", FormatBytes(static_cast<uint64_t>(rate)).c_str());
  std::fflush(stderr);
}

void ProgressBar::Draw(uint64_t done, bool force) {
  if (style_ == ProgressStyle::kNone) return;
  auto now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(draw_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const uint64_t total = total_.load(std::memory_order_relaxed);
  if (style_ == ProgressStyle::kLines) {
    // The 100% line is Finish()'s, once the work is known to be complete.
    if (total && done < total) DrawLine(done, false);
    return;
  }
  if (style_ != ProgressStyle::kBar) return;
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  double secs = std::chrono::duration<double>(now - start_).count();
  double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
  constexpr int kWidth = 30;
  std::string bar;
  if (total > 0) {
    int filled = static_cast<int>(kWidth * (static_cast<double>(done) / static_cast<double>(total)));
    if (filled > kWidth) filled = kWidth;
    bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] ";
    char pct[16];
    std::snprintf(pct, sizeof pct, "%5.1f%% ", 100.0 * static_cast<double>(done) / static_cast<double>(total));
    bar += pct;
  }
  std::fprintf(stderr, "\r\033[K%s %s%s / %s  %s/s", label_.c_str(), bar.c_str(), FormatBytes(done).c_str(),
               total ? FormatBytes(total).c_str() : "?", FormatBytes(static_cast<uint64_t>(rate)).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace zckpt::cli
