// Byte ranges of a container's storages streamed into memory the caller owns, on the host or a
// CUDA device, with no torch anywhere in the build: what the `zckpt` command's `load` and the
// Python module's torch-free `_core` run (loader.h's torch API allocates tensors and drives the
// same pipeline). The CUDA runtime is loaded when a range first names a device, never linked:
// the libcudart already in the process, else the system's; ZCKPT_CUDART=FILE names one (the
// search and its error: src/common/cudart_loader.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zckpt/load_options.h"

namespace zckpt {

class Container;

// Where one byte range of a storage goes: raw bytes [begin, end) of storage index `storage` to
// `dst`, which holds end - begin writable bytes in host memory (device -1) or on CUDA device
// `device`. A whole storage is [0, raw_bytes); a tensor is its record's [byte_begin, byte_end).
struct LoadTarget {
  uint32_t storage = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint8_t* dst = nullptr;
  int32_t device = -1;
};

// One streaming pass filling every target (targets may overlap each other in the file; only the
// chunks they touch are read, each checked unless `options.verify` is false). Copies to a CUDA
// device wait for the work already queued on its legacy default stream. A range outside its
// storage or a null dst for a non-empty range is kInvalidArgument before any byte moves; no CUDA
// runtime to load is kUnsupported, naming every library and folder searched; a chunk failing its
// checksum is kCorrupt naming the file, storage, tensors and byte range. Fills the pipeline
// fields of LoadStats and `seconds` (`storages`: those touched; `tensors` is left 0).
LoadStats LoadRanges(const Container& c, const std::vector<LoadTarget>& targets, const LoadOptions& options);

// What every load of tensors by name does before reading data: the kept object pickle read by
// zckpt's interpreter (the allowlist plus `allow_globals`, "module.name") and held against the
// index. Throws kUnsafe (a refused global) or kCorrupt (damaged, malformed, or disagreeing with
// the index), each naming the file; a container without an object pickle passes.
void CheckObjectPickle(const Container& c, const std::vector<std::string>& allow_globals);

// Memory a load fills, owned: `bytes` of host memory aligned to 4 KiB (device -1, so bytes not in
// the page cache go in with O_DIRECT), or of device memory from cudaMalloc on CUDA device
// `device`. Its contents are undefined until loaded. Throws kOutOfMemory when the memory cannot be
// had, kUnsupported when no CUDA runtime loads, kInvalidArgument for a device the runtime lacks.
class LoadBuffer {
 public:
  explicit LoadBuffer(uint64_t bytes, int device = -1);
  ~LoadBuffer();
  LoadBuffer(const LoadBuffer&) = delete;
  LoadBuffer& operator=(const LoadBuffer&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  int device() const { return device_; }
  // Writes zeros over every byte (device memory through a host page of zeros): a destination
  // faulted in and committed before a load into it.
  void Zero();

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  int device_ = -1;
};

// CUDA devices the loaded runtime sees (kUnsupported when none loads).
int CudaDeviceCount();
// cudaMemGetInfo on `device`: free and total bytes of the whole device, every process counted.
struct CudaMemory {
  uint64_t free = 0;
  uint64_t total = 0;
};
CudaMemory ReadCudaMemory(int device);

// Every storage of a local container readable in place, as Map (loader.h) gives them without
// torch: a storage of raw chunks laid end to end aliases the file's copy-on-write mapping (no
// byte read until touched), any other (zstd chunks) is decoded and checked into a LoadBuffer.
// With `verify`, every aliased chunk is hashed where it lies, on `threads` threads, before the
// constructor returns (kCorrupt naming file, storage, tensors and byte range). Each storage's
// bytes stay while this object or that storage's keeper() lives: views of one storage need not
// keep the others (a decoded storage's memory goes with its last view). kInvalidArgument for a
// container in object storage.
class MappedStorages {
 public:
  MappedStorages(const Container& c, bool verify, unsigned threads);
  ~MappedStorages();
  MappedStorages(const MappedStorages&) = delete;
  MappedStorages& operator=(const MappedStorages&) = delete;
  // Storage `storage`'s raw bytes (raw_bytes of them).
  uint8_t* data(uint32_t storage) const;
  // What keeps data(storage) valid after this object is gone: the file's mapping for a storage
  // aliasing it, the storage's own buffer for a decoded one.
  std::shared_ptr<const void> keeper(uint32_t storage) const;
  uint64_t mapped_bytes() const;   // bytes aliasing the file
  uint64_t decoded_bytes() const;  // bytes decoded into memory of their own

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace zckpt
