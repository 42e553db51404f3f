// The writer's chunk pipeline: hashes (and optionally zstd-compresses) chunks on worker
// threads while the caller keeps filling the next ones, and hands finished chunks back in
// submission order so the file is written sequentially.
//
// Memory is bounded: at most 2 x threads jobs are in flight, each holding one chunk's raw bytes
// and at most as many compressed bytes; Submit() blocks (writing finished chunks) beyond that.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace zckpt::format::internal {

struct ChunkJob {
  // Filled by the caller: the chunk's bytes in `raw`, or, with `borrows`, in caller memory
  // `borrowed` that must stay valid until the job has reached the sink (or Abandon returned).
  std::vector<uint8_t> raw;
  std::span<const uint8_t> borrowed;
  bool borrows = false;
  uint32_t storage = 0;
  uint32_t alignment = 0;
  // Filled by the pipeline.
  std::vector<uint8_t> packed;  // the zstd frame when `compressed`
  bool compressed = false;
  uint64_t raw_checksum = 0, stored_checksum = 0;

  std::span<const uint8_t> input() const { return borrows ? borrowed : std::span<const uint8_t>(raw); }
  std::span<const uint8_t> stored() const { return compressed ? std::span<const uint8_t>(packed) : input(); }

 private:
  friend class ChunkPipeline;
  bool done = false;
  std::exception_ptr error;
};

class ChunkPipeline {
 public:
  // Called on the submitting thread, in submission order, once a job is processed.
  using Sink = std::function<void(const ChunkJob&)>;

  // threads <= 1 processes each job inline in Submit (no worker thread). zstd_level 0: no
  // compression.
  ChunkPipeline(unsigned threads, int zstd_level, Sink sink);
  ~ChunkPipeline();  // stops the workers; jobs not yet handed to the sink are dropped
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  // An empty job, reusing the buffers of a finished one when there is one.
  std::unique_ptr<ChunkJob> NewJob();
  // Queues a filled job; hands finished jobs to the sink while too many are in flight.
  // Rethrows a worker's or the sink's exception.
  void Submit(std::unique_ptr<ChunkJob> job);
  // Hands every queued job to the sink.
  void Drain();
  // Drops every queued job without handing it to the sink, once no worker reads it any more
  // (jobs not started are never started): after an error, before borrowed memory goes away.
  void Abandon() noexcept;

 private:
  void Process(ChunkJob& job) const;
  void WorkerLoop();
  void SinkFront();

  const int zstd_level_;
  const size_t max_in_flight_;
  Sink sink_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<ChunkJob*> work_;                       // guarded by mu_
  std::deque<std::unique_ptr<ChunkJob>> in_flight_;  // submission order; only the caller touches it
  std::vector<std::unique_ptr<ChunkJob>> free_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace zckpt::format::internal
