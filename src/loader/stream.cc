#include "loader/stream.h"

#include <algorithm>
#include <memory>

#include "common/mapped_file.h"
#include "loader/chunk_reader.h"
#include "loader/copy_engine.h"
#include "loader/plan.h"
#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt {

const char* ReadMethodName(ReadMethod method) {
  switch (method) {
    case ReadMethod::kAuto: return "auto";
    case ReadMethod::kPread: return "pread";
    case ReadMethod::kMmap: return "mmap";
    case ReadMethod::kDirect: return "direct";
  }
  return "?";
}

namespace loader {

namespace {

constexpr uint64_t kDefaultSlotBytes = 8ull << 20;
constexpr uint64_t kDestinationBatchBytes = 64ull << 20;
constexpr uint64_t kRemoteBatchBytes = 16ull << 20;

// kAuto: pread. Measured on the CPU path (tools/bench/bench.py, warm page cache), pread
// straight into the destination beat a memcpy out of the mapping (which pays a page fault per
// 4 KiB and the release behind it); on the CUDA path it fills pinned slots the same way.
ReadMethod Resolve(ReadMethod m) { return m == ReadMethod::kAuto ? ReadMethod::kPread : m; }

}  // namespace

uint64_t ResolveSlotBytes(const LoadOptions& o, uint64_t chunk_bytes) {
  if (RingSlots(o) == 0) throw Error(ErrorKind::kInvalidArgument, "LoadOptions::slots must be at least 1");
  if (o.threads == 0) throw Error(ErrorKind::kInvalidArgument, "LoadOptions::threads must be at least 1");
  if (o.slot_bytes == 0) return std::max(chunk_bytes, kDefaultSlotBytes);
  uint64_t aligned = (o.slot_bytes + kDirectIoAlign - 1) / kDirectIoAlign * kDirectIoAlign;
  return std::max(aligned, chunk_bytes);
}

LoadStats StreamChunks(const Container& c, const Destinations& d, const LoadOptions& given,
                       const std::vector<CudaDevice>& cuda_devices, const StagingHooks& staging) {
  LoadStats stats;
  LoadOptions o = given;
  // From an object, each reader thread is one connection waiting on the network more than on the
  // CPU: at least as many as the source asks for (ZCKPT_S3_CONNECTIONS, default 8); the ring
  // grows with them as for local reads (RingSlots).
  if (const ByteSource* remote = c.file().remote()) o.threads = std::max(o.threads, remote->connections());
  uint64_t slot_bytes = ResolveSlotBytes(o, c.superblock().chunk_bytes);
  ChunkReader reader(c, Resolve(o.method), o.verify, o.direct_when_uncached);
  PlanOptions po;
  // Room for one chunk plus O_DIRECT rounding at both ends, so any single chunk fits a slot.
  po.slot_capacity = slot_bytes + 2 * kDirectIoAlign;
  // Batches read straight into destinations: by default large, so that a reader keeps several
  // O_DIRECT reads in flight across a batch's storages when the file is not cached; a slot's
  // worth when the caller sized the slots (finer progress and cancel steps).
  // From an object, 16 MiB: each batch is a reader's ranged GETs (one per run of raw chunks),
  // large enough to keep request overhead small, small enough to spread over the connections.
  po.batch_bytes = o.slot_bytes == 0 ? std::max(slot_bytes, c.file().remote() ? kRemoteBatchBytes : kDestinationBatchBytes)
                                     : slot_bytes;
  po.align_spans = reader.method() == ReadMethod::kDirect;
  po.read_into_destination = o.cpu_read_into_destination && reader.method() != ReadMethod::kDirect;
  Plan plan = MakePlan(c, d, po);

  std::unique_ptr<CopyEngine> engine = cuda_devices.empty() ? MakeCpuCopyEngine() : MakeCudaCopyEngine(cuda_devices, RingSlots(o));
  PipelineConfig config;
  config.threads = o.threads;
  config.slots = RingSlots(o);
  config.slot_capacity = po.slot_capacity;
  config.progress = o.progress;
  config.cancel = o.cancel;
  PipelineStats ps = RunPipeline(plan, d, reader, *engine, config, staging);

  stats.raw_bytes = plan.raw_bytes;
  stats.stored_bytes = plan.stored_bytes;
  stats.chunks = plan.chunks;
  stats.direct_chunks = plan.direct_chunks;
  stats.uncached_bytes = reader.uncached_bytes();
  stats.batches = plan.batches.size();
  stats.ring_bytes = ps.ring_bytes;
  stats.slot_bytes = slot_bytes;
  stats.slots = ps.slots;
  stats.threads = ps.threads;
  stats.method = reader.method();
  stats.verified = o.verify;
  return stats;
}

}  // namespace loader
}  // namespace zckpt
