// zckpt export --format safetensors: container -> `.safetensors`.
#pragma once

#include <string>

#include "zckpt/container.h"

namespace zckpt::convert {

// A container converted from a safetensors file is written back byte for byte: its kept header,
// then each tensor's storage in byte-buffer order (each checked against the header first).
// Any other container must hold what a safetensors file can: its object a flat dict of
// contiguous, plain tensors (no DTensor, ShardedTensor, quantized, conj/neg-bit tensors, no two
// sharing memory) of dtypes safetensors has. It is then laid out exactly as safetensors'
// writer lays out that dict (save_file without metadata), so the file is byte-identical to
// `safetensors.torch.save_file(torch.load(the .pt))`. Anything else: Error(kUnsupported)
// naming the first entry that cannot go; a container contradicting itself: kCorrupt.
void ExportSafetensors(const Container& c, const std::string& destination);

}  // namespace zckpt::convert
