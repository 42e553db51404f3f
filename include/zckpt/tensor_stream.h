// A container's tensors one at a time (libzckpt, LibTorch): what a weight iterator needs
// (vLLM's and SGLang's load_weights(weights), verl's weight sync; zckpt.iter_tensors).
//
// Each Next() allocates one fresh contiguous tensor on the device and streams that tensor
// record's chunks into it through the loader's pipeline (loader.h: reader threads, the ring,
// each chunk's XXH3 checked), reading only the chunks the tensor touches. Memory: the tensor
// handed out plus the ring of that pass (freed when Next returns; pinned slots go back to the
// per-process cache), so a consumer that drops each tensor after use holds at most one tensor
// beyond what it keeps. Between calls the stream keeps the open file, the index and references
// to the last two large CPU tensors' storages: once the consumer has dropped every reference to
// one, the next tensor that fits is written into its pages (already faulted in) instead of new
// ones. A tensor the consumer still references (or any view of it) is never reused.
// Tensors sharing a storage (tied weights, views) each get their own copy of their bytes.
//
// Errors (zckpt::Error) are Load's: kCorrupt naming file, storage, tensors and byte range
// (Container::DescribeChunk) for a bad chunk, found when the chunk is read; with
// TensorStreamOptions::verify_first every chunk of the file is checked at construction,
// before the first tensor is handed out (the whole file is read once more).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zckpt/load_options.h"

namespace zckpt {

class Container;  // zckpt/container.h
struct TensorInfo;

struct TensorStreamOptions {
  LoadOptions load;           // verify (each chunk as it is read), threads, ring, allow_globals
  bool verify_first = false;  // Container::Verify at construction: Error(kCorrupt) listing problems
  std::optional<unsigned> verify_threads;  // for verify_first, as VerifyOptions::threads
};

class TensorStream {
 public:
  // Vets the object pickle once (as Load: it must describe the index's tensors), checks every
  // record is loadable as a plain tensor (Error(kUnsupported) otherwise), then with verify_first
  // checks every chunk. Internal records (a DTensor's DeviceMesh) are skipped.
  TensorStream(std::shared_ptr<const Container> container, c10::Device device, TensorStreamOptions options = {});
  ~TensorStream();

  // The next tensor record in the file's table order: false at the end.
  bool Next(std::string* name, at::Tensor* tensor);
  uint32_t remaining() const;
  const LoadStats& stats() const { return stats_; }  // summed over the passes so far

 private:
  at::Tensor Destination(const TensorInfo& info, c10::ScalarType st);
  void ReadAhead();  // from an object: the next tensors' storages asked for ahead (tensor_stream.cc)

  std::shared_ptr<const Container> c_;
  c10::Device device_;
  TensorStreamOptions options_;
  uint32_t next_ = 0;
  uint32_t ahead_ = 0;                    // the next tensor whose storage to fetch ahead
  uint32_t ahead_storage_ = UINT32_MAX;   // the last storage fetched ahead
  LoadStats stats_;
  std::vector<c10::Storage> recent_;  // the last large CPU storages handed out, reused once unreferenced
};

}  // namespace zckpt
