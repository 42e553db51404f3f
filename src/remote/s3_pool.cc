#include "remote/s3_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace zckpt::remote {

using Clock = std::chrono::steady_clock;

namespace {

// Body bytes moved by every request of the process (either way), counted as they move.
std::atomic<uint64_t> g_bytes{0};

}  // namespace

struct RequestPool::Impl {
  struct Job {
    std::packaged_task<void()> task;
    unsigned cap;
  };

  // Runs queued jobs for as long as the process lives (workers are never joined: the pool is
  // never destroyed, so a worker never outlives what it waits on).
  void Work() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      ready.wait(lock, [&] { return Runnable(); });
      Job job = std::move(queue.front());
      queue.pop_front();
      Started(Clock::now());
      lock.unlock();
      job.task();  // exceptions land in the job's future
      lock.lock();
      Finished(Clock::now());
      ready.notify_all();
    }
  }

  bool Runnable() const { return !queue.empty() && running < std::min(limit, queue.front().cap); }

  // Workers enough for what is running and queued, up to the limit (under mu).
  void Spawn() {
    while (workers < std::min<size_t>(running + queue.size(), limit)) {
      ++workers;
      std::thread([this] { Work(); }).detach();
    }
  }

  // A request starts (under mu). After a pause a new throughput window begins: it measures
  // requests, not idle time.
  void Started(Clock::time_point now) {
    if (running == 0 && (window_start == Clock::time_point{} || now - idle_since > kIdleGap)) {
      window_start = now;
      window_base = g_bytes.load();
      saturated = false;
    }
    peak = std::max(peak, ++running);
  }

  // A request ends (under mu). A window at least kWindowSeconds long in which requests waited
  // for the limit is measured: the first grows the limit by half, and each later one grows it
  // again only while its rate beat the rate before the last growth by kGrowthRatio; the first
  // that does not ends the probing (the limit stays where it got to).
  void Finished(Clock::time_point now) {
    --running;
    if (!queue.empty()) saturated = true;
    const double seconds = std::chrono::duration<double>(now - window_start).count();
    if (seconds >= kWindowSeconds) {
      const double rate = static_cast<double>(g_bytes.load() - window_base) / seconds;
      if (probing && saturated && limit < max_cap) {
        if (rate > rate_before_growth * kGrowthRatio) {
          rate_before_growth = rate;
          limit = std::min(max_cap, limit + limit / 2);
          Spawn();
        } else {
          probing = false;
        }
      }
      window_start = now;
      window_base = g_bytes.load();
      saturated = !queue.empty();
    }
    if (running == 0) idle_since = now;
  }

  std::future<void> Push(std::function<void()> fn, unsigned cap) {
    std::packaged_task<void()> task(std::move(fn));
    std::future<void> done = task.get_future();
    std::lock_guard<std::mutex> lock(mu);
    cap = std::max(1u, cap);
    queue.push_back({std::move(task), cap});
    max_cap = std::max(max_cap, cap);
    Spawn();
    ready.notify_all();
    return done;
  }

  static constexpr double kWindowSeconds = 0.3;
  static constexpr std::chrono::milliseconds kIdleGap{50};

  std::mutex mu;
  std::condition_variable ready;
  std::deque<Job> queue;
  unsigned workers = 0, running = 0, peak = 0;
  unsigned limit = kStartInFlight, max_cap = kStartInFlight;
  // The current throughput window: its start, the byte count then, whether requests waited.
  Clock::time_point window_start{}, idle_since{};
  uint64_t window_base = 0;
  bool saturated = false;
  bool probing = true;            // still growing the limit while it pays
  double rate_before_growth = 0;  // bytes/s of the window that led to the last growth
};

namespace {

RequestPool::Impl* g_impl = nullptr;

void ForgetAfterFork() { g_impl = nullptr; }  // the child has none of the parent's workers

}  // namespace

RequestPool& RequestPool::Instance() {
  static RequestPool pool;
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, ForgetAfterFork); });
  return pool;
}

RequestPool::Impl& RequestPool::impl() const {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!g_impl) g_impl = new Impl;  // never freed: detached workers wait on it until exit
  return *g_impl;
}

std::future<void> RequestPool::Start(std::function<void()> task, unsigned cap) {
  return impl().Push(std::move(task), cap);
}

void RequestPool::RunAll(std::vector<std::function<void()>>& tasks, unsigned cap) {
  // Every task on a worker, the caller's thread included in none: the cap counts them all.
  std::vector<std::future<void>> started;
  started.reserve(tasks.size());
  for (std::function<void()>& t : tasks) started.push_back(Start(std::move(t), cap));
  std::exception_ptr first;
  for (std::future<void>& f : started) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void RequestPool::CountBytes(uint64_t bytes) { g_bytes.fetch_add(bytes, std::memory_order_relaxed); }

unsigned RequestPool::peak_in_flight() const {
  Impl& i = impl();
  std::lock_guard<std::mutex> lock(i.mu);
  return i.peak;
}

}  // namespace zckpt::remote
