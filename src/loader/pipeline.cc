#include "loader/pipeline.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "loader/blocking_queue.h"
#include "loader/chunk_reader.h"
#include "loader/copy_engine.h"
#include "loader/plan.h"
#include "loader/ring.h"
#include "zckpt/error.h"

namespace zckpt::loader {

namespace {

struct Filled {
  size_t batch = 0;
  int slot = -1;  // -1: read straight into destinations
  const uint8_t* bytes = nullptr;  // the slot's, or the batch's bytes in the file's mapping
};

// Everything the threads of one run share.
class Run {
 public:
  Run(const Plan& plan, const Destinations& d, const ChunkReader& reader, CopyEngine& engine,
      const PipelineConfig& config, TimeSplit& split, const StagingHooks& staging, Ring& ring)
      : plan_(plan), d_(d), reader_(reader), engine_(engine), config_(config), split_(split), staging_(staging),
        ring_(ring), received_(d.staged_bytes.size(), 0), batch_in_mapping_(ring.slots(), -1) {}

  // First error wins; then Stop().
  void Fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = e;
    }
    Stop();
  }
  // Closing both queues wakes every thread blocked in them.
  void Stop() {
    stop_ = true;
    ring_.Close();
    filled_.Close();
  }
  std::exception_ptr error() {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return error_;
  }

  void ThrowIfCancelled() const {
    if (config_.cancel != nullptr && config_.cancel->load(std::memory_order_relaxed))
      throw Error(ErrorKind::kCancelled, "load cancelled");
  }

  void ReaderMain() {
    try {
      while (!stop_.load()) {
        ThrowIfCancelled();
        size_t b = next_.fetch_add(1);
        if (b >= plan_.batches.size()) return;
        const Batch& batch = plan_.batches[b];
        int slot = -1;
        if (batch.in_slot) {
          TimeSplit::Scope timed(split_, TimeSplit::kWait);
          std::optional<unsigned> s = ring_.Acquire();
          if (!s) return;
          slot = static_cast<int>(*s);
        }
        const uint8_t* bytes = reader_.Read(batch, plan_, d_, slot >= 0 ? ring_.data(static_cast<unsigned>(slot)) : nullptr);
        if (!filled_.Push({b, slot, bytes})) return;
      }
    } catch (...) {
      Fail(std::current_exception());
    }
  }

  // The calling thread: delivers filled slots until every batch is done or the run fails.
  void DeliverAll() {
    try {
      size_t completed = 0;
      uint64_t done_bytes = 0;
      while (completed < plan_.batches.size()) {
        ThrowIfCancelled();
        ReclaimSlots(false);
        std::optional<Filled> item = filled_.TryPop();
        if (!item) {
          TimeSplit::Scope timed(split_, TimeSplit::kWait);
          if (engine_.HasInFlight()) {  // nothing to deliver: wait for the device instead
            ReclaimSlots(true);
            continue;
          }
          item = filled_.Pop();
          if (!item) return;  // closed: a reader failed
        }
        const Batch& batch = plan_.batches[item->batch];
        if (item->slot >= 0) Deliver(batch, static_cast<unsigned>(item->slot), item->bytes);
        ++completed;
        done_bytes += batch.raw_bytes;
        if (config_.progress) config_.progress(done_bytes, plan_.raw_bytes);
      }
      // The last slots' copies, and the checks that follow them for batches left in the mapping.
      while (engine_.HasInFlight()) ReclaimSlots(true);
    } catch (...) {
      Fail(std::current_exception());
    }
  }

 private:
  // Slots whose copies have completed go back to the readers; a batch the devices copied from the
  // file's mapping is checked there again first (ChunkReader::CheckAfterCopy).
  void ReclaimSlots(bool wait) {
    reclaimed_.clear();
    engine_.Reclaim(wait, &reclaimed_);
    for (unsigned s : reclaimed_) {
      if (int64_t b = batch_in_mapping_[s]; b >= 0) {
        batch_in_mapping_[s] = -1;
        reader_.CheckAfterCopy(plan_.batches[static_cast<size_t>(b)], d_);
      }
      ring_.Release(s);
    }
  }

  // `base`: the batch's bytes, in `slot` or in the file's mapping (ChunkReader::CopyFromMapping);
  // either way the slot goes back to the readers once the copies reading them have completed.
  void Deliver(const Batch& batch, unsigned slot, const uint8_t* base) {
    TimeSplit::Scope timed(split_, TimeSplit::kCopy);
    for (uint64_t i = batch.first; i < batch.last; ++i) {
      for (const Piece& p : d_.of(i)) {
        const uint8_t* src = base + plan_.slot_offset[i] + p.chunk_offset;
        if (p.staged >= 0) {
          auto id = static_cast<uint32_t>(p.staged);
          std::memcpy(staging_.buffer(id) + p.staged_offset, src, p.bytes);
          received_[id] += p.bytes;
          if (received_[id] == d_.staged_bytes[id]) staging_.complete(id);
        } else if (p.device < 0) {
          std::memcpy(p.dst, src, p.bytes);
        } else {
          engine_.CopyToDevice(src, p.dst, p.bytes, p.device);
        }
      }
    }
    engine_.EndSlot(slot);
    if (reader_.InMapping(batch)) batch_in_mapping_[slot] = &batch - plan_.batches.data();
  }

  const Plan& plan_;
  const Destinations& d_;
  const ChunkReader& reader_;
  CopyEngine& engine_;
  const PipelineConfig& config_;
  TimeSplit& split_;
  const StagingHooks& staging_;
  Ring& ring_;
  BlockingQueue<Filled> filled_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
  std::vector<uint64_t> received_;  // per staging id
  std::vector<unsigned> reclaimed_;
  std::vector<int64_t> batch_in_mapping_;  // per slot: the batch its copies read from the mapping, or -1
};

}  // namespace

PipelineStats RunPipeline(const Plan& plan, const Destinations& d, const ChunkReader& reader,
                          CopyEngine& engine, const PipelineConfig& config, TimeSplit& split,
                          const StagingHooks& staging) {
  PipelineStats stats;
  if (plan.batches.empty()) return stats;
  // No more slots than slot batches, no more readers than batches: nothing would use them.
  unsigned slots = static_cast<unsigned>(std::min<uint64_t>(std::max(config.slots, 1u), plan.slot_batches));
  unsigned threads = static_cast<unsigned>(std::min<uint64_t>(std::max(config.threads, 1u), plan.batches.size()));
  Ring ring(engine, slots, config.slot_capacity);
  stats.ring_bytes = ring.bytes();
  stats.slots = slots;
  stats.threads = threads;

  Run run(plan, d, reader, engine, config, split, staging, ring);
  std::vector<std::thread> readers;
  try {
    for (unsigned t = 0; t < threads; ++t) readers.emplace_back([&run] { run.ReaderMain(); });
  } catch (...) {
    run.Fail(std::current_exception());
  }
  if (!run.error()) run.DeliverAll();
  run.Stop();  // readers still waiting for a slot or a batch
  for (auto& t : readers) t.join();
  try {
    engine.Synchronize();  // before the ring (or a destination) can be freed under a copy
  } catch (...) {
    run.Fail(std::current_exception());
  }
  if (std::exception_ptr e = run.error()) std::rethrow_exception(e);
  return stats;
}

}  // namespace zckpt::loader
