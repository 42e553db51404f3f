// Loading a .zckpt container into torch tensors (libzckpt, LibTorch).
//
// Load streams the file once, chunk by chunk: reader threads fill a small ring of host buffers
// (pinned on the CUDA path) and check each chunk's XXH3 as it arrives; a copy engine moves each
// filled buffer to its destination while the next ones fill. Memory during a load is the
// destination plus the ring plus the index, whatever the file size: a tensor may be far larger
// than the ring. On the CPU path, the chunks of storages of 64 KiB or more are read (or decoded)
// straight into the destination, no ring copy (one copy less: docs/benchmarks.md, "Loader
// defaults").
// The CUDA path's pinned ring slots are kept for the next load in a per-process cache (up to
// 256 MiB, ZCKPT_PINNED_CACHE_MB): page-locking and freeing pinned memory each synchronize the
// device. A load to cuda:N leaves the caller's current device as torch's device guard does.
//
// Every function throws zckpt::Error:
//   kIo            cannot open/read the file (not a regular file; it shrank while being read,
//                  e.g. truncated by another process: "FILE: the file changed size while being
//                  read ..."), a CUDA or torch call failed (its message)
//   kNotContainer, kUnsupported   as Container::Open; kUnsupported also for a dtype this torch
//                  lacks, a quantized tensor (use LoadStorages + torch's unpickler), or a CUDA
//                  device in a build without CUDA
//   kCorrupt       a chunk failed its checksum or its zstd frame; the message is
//                  Container::DescribeChunk (file, storage key, tensors, byte ranges). Also, before
//                  any data is read: the kept object pickle is malformed, or describes other
//                  storages or tensor views than the index ("FILE: the object pickle and the
//                  index disagree: tensor 'w': ...")
//   kUnsafe        the kept object pickle names a global off the allowlist (and not in
//                  LoadOptions::allow_globals) or on the deny list, naming it and its offset
//   kInvalidArgument  bad options; LoadInto mismatches
//   kCancelled     LoadOptions::cancel became true
//   kOutOfMemory   a destination, a staging buffer or the ring could not be allocated (torch's
//                  caching allocator ran out of device memory, host or pinned memory ran out):
//                  the Python package raises zckpt.OutOfMemoryError, a torch.OutOfMemoryError
// On any error the load stops cleanly: reader threads are joined, the ring is freed, device work
// is synchronized, and no partial result is returned.
//
// The storage's saved location ("cuda:0" in the file) never decides anything: the caller's
// device does.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zckpt/format.h"
#include "zckpt/load_options.h"

namespace zckpt {

class Container;  // zckpt/container.h

// What the file says about a tensor beyond its view (parallel to TensorSet::tensors).
struct TensorMeta {
  std::string storage_key;
  uint32_t flags = 0;  // format::kTensor* bits as stored
  std::string extra;   // the record's JSON (DTensor, ShardedTensor, ...), empty when none
  bool requires_grad() const { return flags & format::kTensorRequiresGrad; }
  bool is_parameter() const { return flags & format::kTensorParameter; }  // torch.nn.Parameter in the original
};

// Tensors rebuilt as views of their storages: tensors sharing a storage share memory.
struct TensorSet {
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // in the file's table order
  std::vector<TensorMeta> meta;                              // parallel to `tensors`
  std::map<std::string, at::Tensor> storages_by_key;         // uint8, 1-D, raw_bytes long
  // What torch.load would return, as LibTorch values: the kept object pickle read by zckpt's
  // restricted interpreter (nothing executed), each tensor node replaced by the tensor of
  // `tensors` with its name. A pickle object reached twice is the same IValue twice (tied
  // weights are one tensor); a cycle is cut with None. Mapping:
  //   None bool int float str                 as themselves; ints beyond int64: decimal str
  //   bytes / bytearray                       str holding the bytes
  //   tuple, torch.Size                       Tuple
  //   list, set, frozenset                    List[Any]
  //   dict, OrderedDict (state dicts)         Dict[Any, Any] in insertion order; keys other than
  //                                           str/int/float/bool become their repr text
  //   tensor, Parameter, DTensor, shard       the tensor (a DTensor: its local tensor; `meta`
  //                                           has the global layout)
  //   torch.device                            Device
  //   a global (a class, a dtype)             str "module.name"
  //   any other object                        Dict[str, Any] {"__class__": "module.name",
  //                                           and what the pickle gives it: "__args__",
  //                                           "__kwargs__", "__items__", "__entries__",
  //                                           "__state__"}; numpy values are such objects
  // A container without an object pickle gives Dict[str, Tensor] of `tensors`. Empty (None)
  // from LoadStorages / MapStorages.
  c10::IValue tree;
  // The tensor called `name`; Error(kInvalidArgument) when there is none.
  at::Tensor get(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name).has_value(); }
  // Where the tensor called `name` is in `tensors` (and `meta`), if there is one.
  std::optional<size_t> find(std::string_view name) const;
  // Appends a tensor with its meta, found by name from then on: how the loader fills a set.
  void add(std::string name, at::Tensor tensor, TensorMeta meta);

 private:
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in `tensors`
};

struct LoadResult : TensorSet {
  LoadStats stats;
};

// One device allocation per storage (a uint8 tensor of raw_bytes on `device`), every tensor
// record rebuilt on it with as_strided semantics (dtype, shape, stride, storage_offset),
// requires_grad set as saved, conj/neg bits applied as torch's _rebuild_tensor_v2 does.
// `device` may be cpu or cuda[:N]; a cuda device without index means the current one.
// Device memory: the storages only (zstd chunks are decoded on the host).
LoadResult Load(const std::string& path, c10::Device device, const LoadOptions& options = {});

// Every load opens its file once: the object pickle, the index and every chunk are read through
// that one open file description, so a checkpoint renamed over the path during the load (a
// trainer publishing `latest`) gives all of the old file or all of the new, never a mix. The
// overloads taking a Container (Container::Open) read through the caller's open file instead:
// how a caller that reads the container itself too (the Python module vets the pickle it hands
// torch) gets that guarantee across its calls.
LoadResult Load(const Container& container, c10::Device device, const LoadOptions& options = {});

// The storages only (no tensor views): for the Python module, which hands them to torch's own
// unpickler. `tensors`/`meta` are empty.
LoadResult LoadStorages(const std::string& path, c10::Device device, const LoadOptions& options = {});
// The same with each storage on its own device: `devices[key]`, or `fallback` for keys it does not
// name (a dict map_location, CPU storages in a mostly-CUDA file). Still one pass over the file,
// and each device receives its own storages only: none is parked on another device first.
LoadResult LoadStorages(const std::string& path, const std::map<std::string, c10::Device>& devices,
                        c10::Device fallback, const LoadOptions& options = {});
LoadResult LoadStorages(const Container& container, const std::map<std::string, c10::Device>& devices,
                        c10::Device fallback, const LoadOptions& options = {});

struct LoadIntoOptions {
  LoadOptions base;
  bool strict = true;  // missing/unexpected names are an error (as load_state_dict's strict)
};

struct LoadIntoReport {
  std::vector<std::string> missing;     // targets the file does not have
  std::vector<std::string> unexpected;  // tensors of the file no target asked for
  uint64_t tensors_copied = 0;
  uint64_t tensors_direct = 0;  // chunk bytes went straight into the target
  uint64_t tensors_staged = 0;  // went through a host buffer of that tensor's bytes + copy_
  LoadStats stats;
};

// Copies the file's tensors into existing tensors, matched by name, in place, on whatever device
// each target lives on (data_ptr() of every target is unchanged).
// Before the first byte moves: every matched target's dtype and shape are checked (one
// Error(kInvalidArgument) listing every mismatch: tensor, expected, found) and, when strict,
// missing and unexpected names are an error ("Missing key(s): ...; Unexpected key(s): ...").
// A saved tensor contiguous in its storage going to a contiguous target is streamed chunk by
// chunk straight into the target (no temporary, no extra device memory); any other layout
// (strided or offset views, conj/neg bits, non-contiguous targets) stages that tensor's bytes
// in a host buffer and copy_()s it. On an error after copying began (corrupt chunk, CUDA error,
// cancel) targets may be partially written.
LoadIntoReport LoadInto(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& targets,
                        const LoadIntoOptions& options = {});
LoadIntoReport LoadInto(const Container& container, const std::vector<std::pair<std::string, at::Tensor>>& targets,
                        const LoadIntoOptions& options = {});

// Parts of saved tensors (boxes, element runs) into existing tensors: LoadRegions
// (zckpt/load_regions.h).

struct MapStats {
  uint64_t mapped_bytes = 0;   // storage bytes aliasing the mapping
  uint64_t verified_bytes = 0; // of those, checked against their chunks' XXH3 (MapOptions::verify)
  uint64_t decoded_bytes = 0;  // bytes of storages with zstd chunks, decoded into owned memory
  uint64_t storages = 0;
  uint64_t tensors = 0;
  double seconds = 0;
};

struct MapResult : TensorSet {
  MapStats stats;
};

struct MapOptions {
  bool object_tree = true;                 // as LoadOptions::object_tree
  std::vector<std::string> allow_globals;  // as LoadOptions::allow_globals
  // Check every raw chunk of the mapped storages against its XXH3 before returning, reading it
  // where it lies in the mapping (no copy): every page of the storages is mapped in once
  // (MADV_POPULATE_READ) and hashed, on `threads` threads. The tensors returned alias the very
  // page-cache pages that were hashed, so reading them later costs no page fault. Off: nothing
  // is read up front and uncompressed bytes are not checked.
  bool verify = false;
  unsigned threads = DefaultReaderThreads();
};

// CPU tensors aliasing a copy-on-write (MAP_PRIVATE, read-write) mapping of the file, kept alive
// by the tensors' deleters: O(number of tensors) without verify, writes never reach the file.
// Storages with zstd chunks cannot alias the file: they are decoded (and checked) into owned
// memory. With options.verify, every raw chunk is checked in the mapping first: Error(kCorrupt)
// naming the chunk (Container::DescribeChunk) on a mismatch, Error(kIo) naming the file when it
// turns out shorter than its index says (the hashing runs under a SIGBUS guard,
// common/fault_guard.h: no SIGBUS while checking). Without it uncompressed bytes are not checked
// (that would read them): run Container::Verify or `zckpt verify` for that. The index is
// validated as by Container::Open (into private memory: shapes, strides and offsets cannot change
// after Map returns), and the object pickle is read and checked against it as by Load.
// The mapped views have torch.load(mmap=True)'s semantics, not Load's: they read the file when
// touched, so bytes another process rewrites in place later show through (until a page is
// written to; verify checked the bytes as they were when hashed), and touching a page after
// another process truncated the file raises SIGBUS, which kills the process unless it handles
// the signal. Load/LoadInto/LoadStorages (every read method) end such a race with Error(kIo)
// naming the file instead.
MapResult Map(const std::string& path, const MapOptions& options = {});
MapResult Map(const Container& container, const MapOptions& options = {});  // through its open file, as Load's
// The mapped storages only (no views; quantized tensors are no obstacle): for the Python module.
MapResult MapStorages(const std::string& path, const MapOptions& options = {});
MapResult MapStorages(const Container& container, const MapOptions& options = {});

}  // namespace zckpt
