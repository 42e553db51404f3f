#include "loader/stream.h"

#include <algorithm>
#include <memory>

#include "common/mapped_file.h"
#include "format/container_file.h"
#include "loader/chunk_reader.h"
#include "loader/copy_engine.h"
#include "loader/plan.h"
#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt {

using format::internal::ContainerFile;

const char* ReadMethodName(ReadMethod method) {
  switch (method) {
    case ReadMethod::kAuto: return "auto";
    case ReadMethod::kPread: return "pread";
    case ReadMethod::kMmap: return "mmap";
    case ReadMethod::kDirect: return "direct";
  }
  return "?";
}

LoadSizes ResolveLoadSizes(const LoadOptions& o, uint64_t chunk_bytes, unsigned object_connections) {
  // A size set to 0 is the default, as an unset one (zckpt/load_options.h).
  auto given = [](auto v) { return v && *v ? v : decltype(v){}; };
  const auto threads = given(o.threads), slots = given(o.slots);
  const auto slot_bytes = given(o.slot_bytes);
  LoadSizes r;
  // From an object each reader thread is one connection, waiting on the network more than on the
  // CPU: unset, as many as the source asks for.
  r.threads = threads.value_or(std::max(DefaultReaderThreads(), object_connections));
  r.slots = slots.value_or(std::max(kMinRingSlots, r.threads + 2));
  r.slot_bytes = slot_bytes ? std::max((*slot_bytes + loader::kDirectIoAlign - 1) / loader::kDirectIoAlign * loader::kDirectIoAlign, chunk_bytes)
                            : std::max(chunk_bytes, kDefaultSlotBytes);
  r.batch_bytes = slot_bytes ? r.slot_bytes
                             : std::max(r.slot_bytes, object_connections ? kObjectBatchBytes : kDestinationBatchBytes);
  return r;
}

namespace loader {

LoadSizes ResolveContainerLoad(const LoadOptions& o, const Container& c) {
  const ByteSource* remote = ContainerFile::Of(c).remote();
  return ResolveLoadSizes(o, c.superblock().chunk_bytes, remote ? std::max(1u, remote->connections()) : 0);
}

namespace {

// kAuto: pread. Measured on the CPU path (tools/bench/bench.py, warm page cache), pread
// straight into the destination beat a memcpy out of the mapping (which pays a page fault per
// page and the release behind it); on the CUDA path it fills pinned slots the same way.
ReadMethod Resolve(ReadMethod m) { return m == ReadMethod::kAuto ? ReadMethod::kPread : m; }

}  // namespace

LoadStats StreamChunks(const Container& c, const Destinations& d, const LoadOptions& given,
                       const std::vector<CudaDevice>& cuda_devices, const StagingHooks& staging) {
  LoadStats stats;
  const LoadOptions& o = given;
  const LoadSizes sizes = ResolveContainerLoad(o, c);
  TimeSplit split;
  ChunkReader reader(c, Resolve(o.method), o.verify, split, o.direct_when_uncached);
  PlanOptions po;
  // Room for one chunk plus O_DIRECT rounding at both ends, so any single chunk fits a slot.
  po.slot_capacity = sizes.slot_bytes + 2 * kDirectIoAlign;
  po.batch_bytes = sizes.batch_bytes;
  po.align_spans = reader.method() == ReadMethod::kDirect;
  po.read_into_destination = o.cpu_read_into_destination && reader.method() != ReadMethod::kDirect;
  Plan plan = MakePlan(c, d, po);

  std::unique_ptr<CopyEngine> engine = cuda_devices.empty() ? MakeCpuCopyEngine() : MakeCudaCopyEngine(cuda_devices, sizes.slots);
  // Devices that read pageable memory take raw chunks straight from the file's mapping, checked
  // there, instead of through ring slots (docs/unified-memory.md).
  if (engine->ReadsPageableHost()) reader.CopyFromMapping();
  PipelineConfig config;
  config.threads = sizes.threads;
  config.slots = sizes.slots;
  config.slot_capacity = po.slot_capacity;
  config.progress = o.progress;
  config.cancel = o.cancel;
  PipelineStats ps = RunPipeline(plan, d, reader, *engine, config, split, staging);

  stats.raw_bytes = plan.raw_bytes;
  stats.stored_bytes = plan.stored_bytes;
  stats.chunks = plan.chunks;
  stats.destination_chunks = plan.destination_chunks;
  stats.uncached_bytes = reader.uncached_bytes();
  stats.batches = plan.batches.size();
  stats.ring_bytes = ps.ring_bytes;
  stats.slot_bytes = sizes.slot_bytes;
  stats.batch_bytes = sizes.batch_bytes;
  stats.slots = ps.slots;
  stats.threads = ps.threads;
  stats.method = reader.method();
  stats.verified = o.verify;
  stats.read_seconds = split.seconds(TimeSplit::kRead);
  stats.hash_seconds = split.seconds(TimeSplit::kHash);
  stats.copy_seconds = split.seconds(TimeSplit::kCopy);
  stats.wait_seconds = split.seconds(TimeSplit::kWait);
  return stats;
}

}  // namespace loader
}  // namespace zckpt
