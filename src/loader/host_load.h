// Storages and byte ranges streamed into memory the caller owns: the torch-free loads that the
// Python module's `_core` runs (zckpt.load, load_into, iter_tensors). The caller allocates (the
// Python layer: torch's own allocator on the CPU or a CUDA device, or a 4 KiB-aligned HostBuffer
// so that uncached bytes go in with O_DIRECT), this fills; nothing here knows torch.
#pragma once

#include <cstdint>
#include <vector>

#include "loader/copy_engine.h"
#include "zckpt/load_options.h"

namespace zckpt {
class Container;
}

namespace zckpt::loader {

// Where one byte range of a storage goes: bytes [begin, end) of storage `storage` (raw offsets)
// to `dst`, which holds end - begin writable bytes, in host memory (device -1) or on CUDA device
// `device`. A whole storage is [0, raw_bytes); load_into's targets are a tensor record's byte
// range, straight into the tensor's memory or into a staging buffer.
struct ByteRange {
  uint32_t storage = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint8_t* dst = nullptr;
  int32_t device = -1;
};

// One streaming pass filling every listed range (ranges may overlap each other in the file; only
// the chunks they touch are read, each checked unless `options.verify` is false). `cuda_devices`:
// every device a range names, with the caller's stream there for the copies to wait for (empty:
// host ranges only, the CPU engine). A range outside its storage, a null dst for a non-empty
// range, or a device not in `cuda_devices` is kInvalidArgument before any byte moves; no CUDA
// runtime to load is kUnsupported, naming what was searched (cudart_loader.h). Fills the pipeline
// fields of LoadStats plus seconds (storages: those touched).
LoadStats LoadRanges(const Container& c, const std::vector<ByteRange>& ranges, const LoadOptions& options,
                     const std::vector<CudaDevice>& cuda_devices = {});

}  // namespace zckpt::loader
