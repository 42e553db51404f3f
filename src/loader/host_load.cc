#include "loader/host_load.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "loader/plan.h"
#include "loader/stream.h"
#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt::loader {

LoadStats LoadRanges(const Container& c, const std::vector<LoadTarget>& ranges, const LoadOptions& options,
                     const std::vector<CudaDevice>& cuda_devices) {
  auto t0 = std::chrono::steady_clock::now();
  ResolveContainerLoad(options, c);
  const uint64_t chunk_bytes = c.superblock().chunk_bytes;
  std::vector<std::pair<uint64_t, Piece>> pieces;
  std::vector<bool> touched(c.storage_count(), false);
  for (const LoadTarget& r : ranges) {
    if (r.storage >= c.storage_count())
      throw Error(ErrorKind::kInvalidArgument, c.path() + ": no storage index " + std::to_string(r.storage));
    StorageInfo info = c.storage(r.storage);
    if (r.begin > r.end || r.end > info.raw_bytes || (r.end > r.begin && !r.dst))
      throw Error(ErrorKind::kInvalidArgument, c.path() + ": storage '" + std::string(info.key) + "' holds " +
                                                   std::to_string(info.raw_bytes) + " bytes, not the range [" +
                                                   std::to_string(r.begin) + ", " + std::to_string(r.end) + ")");
    if (r.device >= 0 && std::none_of(cuda_devices.begin(), cuda_devices.end(),
                                      [&](const CudaDevice& d) { return d.index == r.device; }))
      throw Error(ErrorKind::kInvalidArgument, c.path() + ": storage '" + std::string(info.key) + "' goes to cuda:" +
                                                   std::to_string(r.device) + ", which has no stream given for the load");
    if (r.end == r.begin) continue;
    touched[r.storage] = true;
    for (uint64_t k = r.begin / chunk_bytes; k * chunk_bytes < r.end; ++k) {
      uint64_t chunk_begin = k * chunk_bytes;
      uint64_t lo = std::max(chunk_begin, r.begin);
      uint64_t hi = std::min(chunk_begin + chunk_bytes, r.end);
      Piece p;
      p.chunk_offset = lo - chunk_begin;
      p.bytes = hi - lo;
      p.dst = r.dst + (lo - r.begin);
      p.device = r.device;
      pieces.emplace_back(info.first_chunk + k, p);
    }
  }
  Destinations d(c.chunk_count(), std::move(pieces));
  LoadStats stats = StreamChunks(c, d, options, cuda_devices);
  stats.storages = static_cast<uint64_t>(std::count(touched.begin(), touched.end(), true));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace zckpt::loader
