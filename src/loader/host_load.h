// Storages streamed into host memory the caller owns: the torch-free load that the Python module's
// `_core` runs for every CPU destination (zckpt.load with map_location cpu). The caller allocates
// (the Python layer: torch's own allocator, or a 4 KiB-aligned HostBuffer so that uncached bytes
// go in with O_DIRECT), this fills; nothing here knows torch.
#pragma once

#include <cstdint>
#include <vector>

#include "zckpt/load_options.h"

namespace zckpt {
class Container;
}

namespace zckpt::loader {

// Where one storage goes: `bytes` writable bytes at `dst`, which must be the storage's raw size
// (StorageInfo::raw_bytes).
struct HostStorage {
  uint32_t storage = 0;  // index in the container's storage table
  uint8_t* dst = nullptr;
  uint64_t bytes = 0;
};

// One streaming pass filling every listed storage (each at most once; storages not listed are not
// read), checksums checked unless `options.verify` is false. Errors name the file, storage and
// byte range (Error's place); a size that is not the storage's is kInvalidArgument before any byte
// moves. Fills the pipeline fields of LoadStats plus storages and seconds.
LoadStats LoadStoragesToHost(const Container& c, const std::vector<HostStorage>& storages, const LoadOptions& options);

// Where one byte range of a storage goes: bytes [begin, end) of storage `storage` (raw offsets)
// to `dst`, which holds end - begin writable bytes. load_into's CPU targets: a tensor record's
// byte range, straight into the tensor's memory or into a staging buffer.
struct HostRange {
  uint32_t storage = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint8_t* dst = nullptr;
};

// One streaming pass filling every listed range (ranges may overlap each other in the file; only
// the chunks they touch are read, each checked unless `options.verify` is false). A range outside
// its storage, or a null dst for a non-empty range, is kInvalidArgument before any byte moves.
// Fills the pipeline fields of LoadStats plus seconds (storages: those touched).
LoadStats LoadRangesToHost(const Container& c, const std::vector<HostRange>& ranges, const LoadOptions& options);

}  // namespace zckpt::loader
