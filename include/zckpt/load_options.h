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
  kAuto,    // pread: the fastest for both the CPU and the pinned-ring path (docs/benchmarks.md,
            // "Loader defaults")
  kPread,   // pread(2) from a plain descriptor: page cache, no mapping to release
  kMmap,    // memcpy from the container's mapping, pages released behind the stream; a SIGBUS
            // from a file truncated meanwhile becomes Error(kIo) (common/fault_guard.h)
  kDirect,  // O_DIRECT pread into 4 KiB-aligned ring slots (bypasses the page cache); falls back
            // to kPread where the filesystem refuses O_DIRECT (tmpfs); stats.method says which
};

const char* ReadMethodName(ReadMethod method);  // "auto", "pread", "mmap", "direct"

// Default reader threads: half the hardware threads, 2 to 8. One reader copies from the page
// cache at about one core's memcpy speed, several are needed to keep a host-to-device copy
// busy, and fresh CPU destinations fault in faster from several threads; the other half of the
// cores is left to the caller (docs/benchmarks.md, "Loader defaults").
inline unsigned DefaultReaderThreads() {
  unsigned hw = std::thread::hardware_concurrency();
  return std::clamp(hw / 2, 2u, 8u);
}

// The defaults a load resolves its unset options to (ResolveLoadSizes), each with its reason.
// A ring slot holds at least one chunk (a chunk is checked and decoded whole), and at least
// this much, so that the many small chunks of small storages share one.
inline constexpr uint64_t kDefaultSlotBytes = 8ull << 20;
// Ring slots: one per reader plus two being copied, and never fewer than this.
inline constexpr unsigned kMinRingSlots = 4;
// Raw bytes of one batch read straight into CPU destinations from a file: large, so that a
// reader keeps several O_DIRECT reads in flight across a batch's storages when the file is not
// cached.
inline constexpr uint64_t kDestinationBatchBytes = 64ull << 20;
// The same from an object: each batch is one reader's read, split into ranged GETs by the
// object (ZCKPT_S3_GET_MB each, in parallel).
inline constexpr uint64_t kObjectBatchBytes = 16ull << 20;

struct LoadOptions {
  // Each size below is unset by default and then resolved by ResolveLoadSizes; one set to 0 is
  // the default too (the one rule for sizes and threads of the library, Python and `zckpt`).
  // Size of one ring slot, rounded up to 4 KiB and to the file's chunk_bytes (a chunk must fit
  // a slot); many small chunks share a slot. Unset: max(chunk_bytes, kDefaultSlotBytes). Set, it
  // is also the raw bytes of one batch read straight into CPU destinations (finer progress and
  // cancel steps).
  std::optional<uint64_t> slot_bytes;
  // Threads reading and checking chunks: `zckpt load --threads`, Python's threads=. Unset:
  // DefaultReaderThreads(), and from an object at least the reader threads it asks for (8;
  // the object runs each reader's reads as parallel ranged GETs: src/remote/README.md).
  std::optional<unsigned> threads;
  // Ring slots. Unset: max(kMinRingSlots, threads + 2) of the threads the load runs with.
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
  // destination instead of a slot + memcpy. On by default (one copy less; docs/benchmarks.md,
  // "Loader defaults"); off forces every byte through the ring. Small storages are always
  // packed into slots.
  bool cpu_read_into_destination = true;
  // With kAuto/kPread: bytes read straight into CPU destinations that are not in the page cache
  // (mincore) are read with O_DIRECT, eight 8 MiB reads in flight per reader thread, instead of
  // buffered reads (which read ahead in small requests; docs/benchmarks.md, "Loader defaults").
  // Cached bytes are still copied from the page cache. Off: always through the page cache.
  bool direct_when_uncached = true;
  // Called on the calling thread after each slot is delivered: raw bytes done, raw bytes total.
  std::function<void(uint64_t, uint64_t)> progress;
  // Polled between slots; when it becomes true the load stops with Error(kCancelled).
  const std::atomic<bool>* cancel = nullptr;
};

// What a load runs with once every option is resolved; LoadStats reports it.
struct LoadSizes {
  unsigned threads = 0;
  unsigned slots = 0;        // at most: a load never makes more than its batches need
  uint64_t slot_bytes = 0;
  uint64_t batch_bytes = 0;  // raw bytes of a batch read straight into CPU destinations
};

// The one resolver of a load's sizes, for a file whose chunks are `chunk_bytes`;
// `object_connections`: the connections an object asks for (0: a local file). Throws
// Error(kInvalidArgument) for an option set to 0.
LoadSizes ResolveLoadSizes(const LoadOptions& o, uint64_t chunk_bytes, unsigned object_connections = 0);

struct LoadStats {
  uint64_t raw_bytes = 0;     // bytes delivered into destinations (decoded)
  uint64_t stored_bytes = 0;  // bytes of chunks read from the file
  uint64_t chunks = 0;        // chunks read
  uint64_t destination_chunks = 0; // of which read straight into a CPU destination
  uint64_t uncached_bytes = 0; // of those, bytes read with O_DIRECT (not in the page cache)
  uint64_t batches = 0;       // units of work (a slot's worth of chunks)
  uint64_t storages = 0;
  uint64_t tensors = 0;
  uint64_t ring_bytes = 0;    // host memory of the ring (0 when nothing needed a slot)
  uint64_t slot_bytes = 0;    // as resolved (LoadSizes)
  uint64_t batch_bytes = 0;   // as resolved (LoadSizes)
  unsigned slots = 0;         // slots made (at most the resolved count)
  unsigned threads = 0;       // reader threads run
  ReadMethod method = ReadMethod::kAuto;  // the method actually used
  bool verified = false;
  double seconds = 0;         // wall time of the whole call
  // Where the threads' time went, in thread-seconds summed over every thread (with N readers
  // they add up to about N x the streaming part of `seconds`): reading bytes into memory (pread,
  // a mapping, a GET; a zstd chunk's decoding too), hashing them (each piece right after it
  // lands, while in cache), copying ring slots into their destinations (host memcpy, or queuing
  // a device copy), waiting (a reader for a free slot; the delivering thread for a filled slot
  // or the device). Bytes read straight into a destination have no copy step.
  double read_seconds = 0;
  double hash_seconds = 0;
  double copy_seconds = 0;
  double wait_seconds = 0;
};

}  // namespace zckpt
