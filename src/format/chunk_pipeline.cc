#include "format/chunk_pipeline.h"

#include "format/chunk_codec.h"
#include "zckpt/format.h"

namespace zckpt::format::internal {

ChunkPipeline::ChunkPipeline(unsigned threads, int zstd_level, Sink sink)
    : zstd_level_(zstd_level), max_in_flight_(threads > 1 ? 2 * size_t{threads} : 1), sink_(std::move(sink)) {
  if (threads > 1)
    for (unsigned t = 0; t < threads; ++t) workers_.emplace_back([this] { WorkerLoop(); });
}

ChunkPipeline::~ChunkPipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ChunkPipeline::Process(ChunkJob& job) const {
  std::span<const uint8_t> in = job.input();
  job.raw_checksum = Checksum(in.data(), in.size());
  job.compressed = zstd_level_ > 0 && CompressChunk(in.data(), in.size(), zstd_level_, &job.packed);
  job.stored_checksum = job.compressed ? Checksum(job.packed.data(), job.packed.size()) : job.raw_checksum;
}

void ChunkPipeline::WorkerLoop() {
  for (;;) {
    ChunkJob* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
      if (stop_) return;
      job = work_.front();
      work_.pop_front();
    }
    std::exception_ptr error;
    try {
      Process(*job);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->error = error;
      job->done = true;
    }
    done_cv_.notify_all();
  }
}

std::unique_ptr<ChunkJob> ChunkPipeline::NewJob() {
  if (free_.empty()) return std::make_unique<ChunkJob>();
  std::unique_ptr<ChunkJob> job = std::move(free_.back());
  free_.pop_back();
  job->raw.clear();
  job->borrowed = {};
  job->borrows = false;
  job->compressed = false;
  job->done = false;
  job->error = nullptr;
  return job;
}

void ChunkPipeline::Submit(std::unique_ptr<ChunkJob> job) {
  if (workers_.empty()) {
    Process(*job);
    job->done = true;
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back(job.get());
  }
  in_flight_.push_back(std::move(job));
  work_cv_.notify_one();
  while (in_flight_.size() >= max_in_flight_) SinkFront();
}

void ChunkPipeline::Drain() {
  while (!in_flight_.empty()) SinkFront();
}

void ChunkPipeline::Abandon() noexcept {
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (ChunkJob* job : work_) job->done = true;  // never started: nothing reads it
    work_.clear();
    for (const auto& job : in_flight_) done_cv_.wait(lock, [&] { return job->done; });
  }
  in_flight_.clear();
}

void ChunkPipeline::SinkFront() {
  ChunkJob* job = in_flight_.front().get();
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return job->done; });
  }
  std::unique_ptr<ChunkJob> owned = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (owned->error) std::rethrow_exception(owned->error);
  sink_(*owned);
  if (free_.size() < max_in_flight_) free_.push_back(std::move(owned));
}

}  // namespace zckpt::format::internal
