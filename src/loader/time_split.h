// Where a load's threads spend their time, for LoadStats: thread-seconds per step, summed over
// every thread that takes the step, so with N reader threads they add up to about N x the wall
// time. The steps are the ones a byte goes through: read (file, mapping or object into memory),
// hash (the chunk checker), copy (a ring slot into its destinations), wait (a reader for a free
// slot, the delivering thread for a filled slot or the device).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace zckpt::loader {

class TimeSplit {
 public:
  enum Step { kRead, kHash, kCopy, kWait, kSteps };

  // Adds the time from its construction to its destruction to `step`. Two clock reads a scope
  // (tens of ns): scopes are a 512 KiB piece or larger, so timing costs nothing measurable.
  class Scope {
   public:
    Scope(TimeSplit& split, Step step) : split_(split), step_(step), start_(std::chrono::steady_clock::now()) {}
    ~Scope() { split_.Add(step_, std::chrono::steady_clock::now() - start_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    TimeSplit& split_;
    Step step_;
    std::chrono::steady_clock::time_point start_;
  };

  void Add(Step step, std::chrono::steady_clock::duration d) {
    ns_[step].fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()),
                        std::memory_order_relaxed);
  }
  double seconds(Step step) const { return static_cast<double>(ns_[step].load(std::memory_order_relaxed)) * 1e-9; }

 private:
  std::array<std::atomic<uint64_t>, kSteps> ns_{};
};

}  // namespace zckpt::loader
