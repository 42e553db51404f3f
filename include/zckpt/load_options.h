// Options and statistics of a streaming load (libzckpt), without torch: the reader pipeline,
// the command-line tool and the Python module share them. The load itself is in loader.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace zckpt {

enum class ReadMethod {
  kAuto,    // pread (measured fastest here for both the CPU and the pinned-ring path)
  kPread,   // pread(2) from a plain descriptor: page cache, no mapping to release
  kMmap,    // memcpy from the container's mapping, pages released behind the stream; a SIGBUS
            // from a file truncated meanwhile becomes Error(kIo) (common/fault_guard.h)
  kDirect,  // O_DIRECT pread into 4 KiB-aligned ring slots (bypasses the page cache); falls back
            // to kPread where the filesystem refuses O_DIRECT (tmpfs); stats.method says which
};

const char* ReadMethodName(ReadMethod method);  // "auto", "pread", "mmap", "direct"

// Default reader threads: half the hardware threads, 2 to 8. One reader copies from the page
// cache at roughly one core's memcpy speed (~5-10 GB/s), a PCIe 5 host-to-device copy runs at
// ~50 GB/s, and fresh CPU destinations fault in faster from several threads; on the 2-core
// development VM this is the 2 measured there.
inline unsigned DefaultReaderThreads() {
  unsigned hw = std::thread::hardware_concurrency();
  return std::clamp(hw / 2, 2u, 8u);
}

struct LoadOptions {
  // Size of one ring slot. 0: max(chunk_bytes, 8 MiB). Rounded up to the file's chunk_bytes
  // (a chunk is checked and decoded whole, so it must fit a slot). Many small chunks share a slot.
  // Also the raw bytes of one batch read straight into CPU destinations (0: 64 MiB).
  uint64_t slot_bytes = 0;
  // Threads reading + checking chunks (>= 1): `zckpt load --threads`, Python's threads=. (Called
  // reader_threads in 0.1.0: one concept, one name in the CLI, C++ and Python.)
  unsigned threads = DefaultReaderThreads();
  // Ring slots (>= 1): every reader one, plus two in copy. Unset (the default): max(4,
  // threads + 2) of the threads the load runs with (RingSlots), so raising threads raises it.
  std::optional<unsigned> slots;
  bool verify = true;           // check each chunk's XXH3 (zstd frames are always checked whole)
  // Load: also build TensorSet::tree from the kept object pickle (a malformed pickle is then an
  // error). Off: the tensors only, the tree None.
  bool object_tree = true;
  // Every load that gives tensors by name (Load, LoadInto, Map) first reads the kept object
  // pickle with zckpt's interpreter and checks that it describes the same tensors as the index
  // (one container, one answer, whichever loader reads it). The pickle may name globals on
  // zckpt's allowlist of data globals, and these ("module.name") besides: classes of the
  // caller's own. Globals on the deny list stay refused.
  std::vector<std::string> allow_globals;
  ReadMethod method = ReadMethod::kAuto;
  // CPU destinations: read (or decode) the chunks of storages >= 64 KiB straight into the
  // destination instead of a slot + memcpy. On by default (one copy less, ~2x faster measured);
  // off forces every byte through the ring. Small storages are always packed into slots.
  bool cpu_read_into_destination = true;
  // With kAuto/kPread: bytes read straight into CPU destinations that are not in the page cache
  // (mincore) are read with O_DIRECT, four 8 MiB reads in flight per reader thread, instead of
  // buffered reads (which read ahead in small requests: ~3x slower cold here). Cached bytes are
  // still copied from the page cache. Off: always through the page cache.
  bool direct_when_uncached = true;
  // Called on the calling thread after each slot is delivered: raw bytes done, raw bytes total.
  std::function<void(uint64_t, uint64_t)> progress;
  // Polled between slots; when it becomes true the load stops with Error(kCancelled).
  const std::atomic<bool>* cancel = nullptr;
};

// The ring slots a load with `o` uses (at most: never more than batches that need a slot).
inline unsigned RingSlots(const LoadOptions& o) { return o.slots ? *o.slots : std::max(4u, o.threads + 2); }

struct LoadStats {
  uint64_t raw_bytes = 0;     // bytes delivered into destinations (decoded)
  uint64_t stored_bytes = 0;  // bytes of chunks read from the file
  uint64_t chunks = 0;        // chunks read
  uint64_t direct_chunks = 0; // of which read straight into a CPU destination
  uint64_t uncached_bytes = 0; // of those, bytes read with O_DIRECT (not in the page cache)
  uint64_t batches = 0;       // units of work (a slot's worth of chunks)
  uint64_t storages = 0;
  uint64_t tensors = 0;
  uint64_t ring_bytes = 0;    // host memory of the ring (0 when nothing needed a slot)
  uint64_t slot_bytes = 0;
  unsigned slots = 0;
  unsigned threads = 0;
  ReadMethod method = ReadMethod::kAuto;  // the method actually used
  bool verified = false;
  double seconds = 0;         // wall time of the whole call
};

}  // namespace zckpt
