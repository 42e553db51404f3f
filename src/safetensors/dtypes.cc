#include "safetensors/dtypes.h"

#include <array>

namespace zckpt::safetensors {

namespace {

// safetensors 0.8's Dtype enum in declaration order (the rank). F4 is float4_e2m1fn_x2 with
// the last dimension counted in 4-bit elements, i.e. twice torch's.
constexpr std::array<DTypeInfo, 22> kTable = {{
    {"BOOL", DType::kBool, 8, 0},
    {"F4", DType::kFloat4_e2m1fn_x2, 4, 1},
    {"F6_E2M3", DType::kInvalid, 6, 2},
    {"F6_E3M2", DType::kInvalid, 6, 3},
    {"U8", DType::kUInt8, 8, 4},
    {"I8", DType::kInt8, 8, 5},
    {"F8_E5M2", DType::kFloat8_e5m2, 8, 6},
    {"F8_E4M3", DType::kFloat8_e4m3fn, 8, 7},
    {"F8_E8M0", DType::kFloat8_e8m0fnu, 8, 8},
    {"F8_E4M3FNUZ", DType::kFloat8_e4m3fnuz, 8, 9},
    {"F8_E5M2FNUZ", DType::kFloat8_e5m2fnuz, 8, 10},
    {"I16", DType::kInt16, 16, 11},
    {"U16", DType::kUInt16, 16, 12},
    {"F16", DType::kFloat16, 16, 13},
    {"BF16", DType::kBFloat16, 16, 14},
    {"I32", DType::kInt32, 32, 15},
    {"U32", DType::kUInt32, 32, 16},
    {"F32", DType::kFloat32, 32, 17},
    {"C64", DType::kComplex64, 64, 18},
    {"F64", DType::kFloat64, 64, 19},
    {"I64", DType::kInt64, 64, 20},
    {"U64", DType::kUInt64, 64, 21},
}};

}  // namespace

std::optional<DTypeInfo> FindDType(std::string_view name) {
  for (const DTypeInfo& d : kTable)
    if (d.name == name) return d;
  return std::nullopt;
}

std::optional<DTypeInfo> FindTorchDType(DType dtype) {
  if (dtype == DType::kInvalid) return std::nullopt;
  for (const DTypeInfo& d : kTable)
    if (d.dtype == dtype) return d;
  return std::nullopt;
}

}  // namespace zckpt::safetensors
