// Helpers of the hardening suites: deterministic containers, digests of what a reader reads,
// the built `zckpt` tool, child processes that can be killed.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "zckpt/container.h"
#include "zckpt/container_writer.h"

namespace zckpt::hardening {

// Writes a container with ContainerWriter: `storages` storages of varied sizes (from a few bytes
// to `max_storage_bytes`), compressible and incompressible contents (so a zstd level gives both
// codecs), 4 KiB chunks by default (many chunks), tensors viewing them, a blob and metadata.
// Deterministic for a given seed and options.
void WriteSampleContainer(const std::string& path, uint64_t seed, unsigned storages = 12,
                          uint64_t max_storage_bytes = 1 << 20, int zstd_level = 3, uint64_t chunk_bytes = 4096);

// Writes a copy of container `path` to `out` with one byte of its middle chunk's stored bytes
// flipped (at `at`, by `mask`); returns that chunk's index. A checksum failure mid-stream.
uint64_t CopyWithCorruptMiddleChunk(const std::string& path, const std::string& out, uint64_t at = 7,
                                    uint8_t mask = 0x40);

// Sets `flag` after `us` microseconds, from a thread of its own; joined on destruction. A cancel
// arriving at any point of a load.
class CancelAfter {
 public:
  CancelAfter(std::atomic<bool>& flag, int us);
  ~CancelAfter();
  CancelAfter(const CancelAfter&) = delete;
  CancelAfter& operator=(const CancelAfter&) = delete;

 private:
  std::thread thread_;
};

// Digest of everything a reader gets from a container: every chunk decoded (with checks), every
// blob, the tensor and storage records, the metadata. Throws what the reader throws.
uint64_t DigestContainer(const Container& c);
uint64_t DigestFile(const std::string& path);  // Open + DigestContainer
// XXH3 of a file's bytes.
uint64_t FileChecksum(const std::string& path);

// $NAME as a number, or `fallback` when unset or empty (test sizes and durations).
double EnvDouble(const char* name, double fallback);

// The `zckpt` tool of this build ($ZCKPT_BUILD_ROOT/tools/zckpt); "" when it is not there.
std::string ZckptTool();
// True when this build's `zckpt load` works (the loader library exists).
bool ZckptLoadAvailable();

// Starts `argv` (argv[0] a path) as a child process with stdout/stderr to `log` ("" for
// /dev/null); returns its pid.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log = "");
// Waits for `pid`; returns the exit status (0..255) or 128 + signal.
int Wait(pid_t pid);

// Names in `dir` other than `keep`, which must all be temporaries of `dest_name`
// (".<dest_name>.zckpt-tmp-*"); returns the names that are not.
std::vector<std::string> UnexpectedEntries(const std::string& dir, const std::vector<std::string>& keep,
                                           const std::string& dest_name);
bool IsTempOf(const std::string& entry, const std::string& dest_name);

}  // namespace zckpt::hardening
