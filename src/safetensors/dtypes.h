// safetensors' element types (the header's "dtype" strings) and the torch dtypes they hold.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "zckpt/dtype.h"

namespace zckpt::safetensors {

struct DTypeInfo {
  std::string_view name;  // as the header spells it: "F32", "BF16", "F8_E4M3", ...
  // torch's type for the bytes; kInvalid for types torch has none for (F6_E2M3, F6_E3M2).
  DType dtype;
  uint32_t bits;  // per element as the header counts elements (F4: 4, F6_*: 6)
  // Position in safetensors' Dtype enum (declared in increasing alignment). Its writer lays
  // tensors out by this rank, highest first, then by name; export reproduces that order.
  uint32_t rank;
};

// The entry for a header dtype string; nullopt for a string safetensors does not define.
std::optional<DTypeInfo> FindDType(std::string_view name);
// The entry safetensors writes for a torch dtype; nullopt when it has none (complex128, ...).
std::optional<DTypeInfo> FindTorchDType(DType dtype);

}  // namespace zckpt::safetensors
