// zckpt export --format safetensors: container -> `.safetensors`.
#pragma once

#include <string>
#include <vector>

#include "zckpt/container.h"

namespace zckpt::convert {

// A container converted from a safetensors file is written back byte for byte: its kept header,
// then each tensor's storage in byte-buffer order (each checked against the header first).
// Any other container must hold what a safetensors file can: its object a flat dict of
// contiguous, plain tensors (no DTensor, ShardedTensor, quantized, conj/neg-bit tensors, no two
// sharing memory) of dtypes safetensors has. It is then laid out exactly as safetensors'
// writer lays out that dict (save_file without metadata), so the file is byte-identical to
// `safetensors.torch.save_file(torch.load(the .pt))`. Anything else: Error(kUnsupported)
// naming the first entry that cannot go; a container contradicting itself: kCorrupt. Either way
// the object pickle is first read under the allowlist plus `allow_globals` and checked against
// the index (convert/object_pickle.h): kUnsafe / kCorrupt.
void ExportSafetensors(const Container& c, const std::string& destination,
                       const std::vector<std::string>& allow_globals = {});

}  // namespace zckpt::convert
