// The requests one process keeps in flight to object storage: a process-wide set of worker
// threads, each with its own easy handle (its connection kept open from request to request),
// shared by every object read and every upload. Internal to src/remote.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <vector>

namespace zckpt::remote {

// How many of the pool's requests may run at once, grown while throughput grows (as AWS's CRT
// does toward a target): it starts at kStartInFlight; the first window of at least 0.3 s in
// which requests waited for the limit raises it by half, and each later such window raises it
// again only while its bytes per second beat the window before the last raise by kGrowthRatio;
// the first that does not ends the probing (once a process). Never above the cap
// (S3Config::connections). Over a link with S3's latency (tens of ms to the first byte, each
// connection tens of MiB/s) it climbs until latency x bandwidth is covered; where a few
// connections fill the link it stops after one step.
inline constexpr unsigned kStartInFlight = 16;
inline constexpr double kGrowthRatio = 1.05;

class RequestPool {
 public:
  static RequestPool& Instance();

  // Runs every task on the pool, at most `cap` of its requests at once (and at most the grown
  // limit); returns when all have finished, then rethrows the first task's exception if any
  // threw (no task is left writing into memory its caller may free).
  void RunAll(std::vector<std::function<void()>>& tasks, unsigned cap);
  // Starts `task` on a worker (queued while `cap` of the pool's requests are running).
  std::future<void> Start(std::function<void()> task, unsigned cap);
  // Body bytes a request moved just now (either way): the throughput the limit grows by.
  static void CountBytes(uint64_t bytes);

  // Most requests that ran at once since the process started (tests, benchmarks).
  unsigned peak_in_flight() const;

  struct Impl;  // s3_pool.cc

 private:
  RequestPool() = default;
  Impl& impl() const;
};

}  // namespace zckpt::remote
