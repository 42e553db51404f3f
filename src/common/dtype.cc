#include "zckpt/dtype.h"

#include <array>

namespace zckpt {

namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  uint32_t size;
  std::string_view storage_name;  // typed storage class prefix, "" when torch has none
};

// One row per code, in code order, so lookups by code are an index.
constexpr std::array<DTypeInfo, kMaxDTypeCode + 1> kTable = {{
    {DType::kInvalid, "invalid", 0, ""},
    {DType::kBool, "bool", 1, "Bool"},
    {DType::kUInt8, "uint8", 1, "Byte"},
    {DType::kInt8, "int8", 1, "Char"},
    {DType::kInt16, "int16", 2, "Short"},
    {DType::kInt32, "int32", 4, "Int"},
    {DType::kInt64, "int64", 8, "Long"},
    {DType::kUInt16, "uint16", 2, ""},
    {DType::kUInt32, "uint32", 4, ""},
    {DType::kUInt64, "uint64", 8, ""},
    {DType::kFloat16, "float16", 2, "Half"},
    {DType::kBFloat16, "bfloat16", 2, "BFloat16"},
    {DType::kFloat32, "float32", 4, "Float"},
    {DType::kFloat64, "float64", 8, "Double"},
    {DType::kComplex32, "complex32", 4, "ComplexHalf"},
    {DType::kComplex64, "complex64", 8, "ComplexFloat"},
    {DType::kComplex128, "complex128", 16, "ComplexDouble"},
    {DType::kFloat8_e4m3fn, "float8_e4m3fn", 1, ""},
    {DType::kFloat8_e5m2, "float8_e5m2", 1, ""},
    {DType::kFloat8_e4m3fnuz, "float8_e4m3fnuz", 1, ""},
    {DType::kFloat8_e5m2fnuz, "float8_e5m2fnuz", 1, ""},
    {DType::kFloat8_e8m0fnu, "float8_e8m0fnu", 1, ""},
    {DType::kFloat4_e2m1fn_x2, "float4_e2m1fn_x2", 1, ""},
    {DType::kQInt8, "qint8", 1, "QInt8"},
    {DType::kQUInt8, "quint8", 1, "QUInt8"},
    {DType::kQInt32, "qint32", 4, "QInt32"},
    {DType::kQUInt4x2, "quint4x2", 1, "QUInt4x2"},
    {DType::kQUInt2x4, "quint2x4", 1, "QUInt2x4"},
    {DType::kBits1x8, "bits1x8", 1, ""},
    {DType::kBits2x4, "bits2x4", 1, ""},
    {DType::kBits4x2, "bits4x2", 1, ""},
    {DType::kBits8, "bits8", 1, ""},
    {DType::kBits16, "bits16", 2, ""},
    {DType::kUInt1, "uint1", 1, ""},
    {DType::kUInt2, "uint2", 1, ""},
    {DType::kUInt3, "uint3", 1, ""},
    {DType::kUInt4, "uint4", 1, ""},
    {DType::kUInt5, "uint5", 1, ""},
    {DType::kUInt6, "uint6", 1, ""},
    {DType::kUInt7, "uint7", 1, ""},
    {DType::kInt1, "int1", 1, ""},
    {DType::kInt2, "int2", 1, ""},
    {DType::kInt3, "int3", 1, ""},
    {DType::kInt4, "int4", 1, ""},
    {DType::kInt5, "int5", 1, ""},
    {DType::kInt6, "int6", 1, ""},
    {DType::kInt7, "int7", 1, ""},
    {DType::kBComplex32, "bcomplex32", 4, ""},
}};

// The highest dtype code of each minor version of format 1, in minor order.
constexpr uint16_t kMaxCodeOfMinor[] = {46, 47};

struct Alias {
  std::string_view alias;
  DType dtype;
};
constexpr Alias kAliases[] = {
    {"float", DType::kFloat32},    {"double", DType::kFloat64},    {"half", DType::kFloat16},
    {"long", DType::kInt64},       {"int", DType::kInt32},         {"short", DType::kInt16},
    {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128}, {"chalf", DType::kComplex32},
};

}  // namespace

bool IsValidDType(uint16_t code) { return code >= 1 && code <= kMaxDTypeCode; }

uint16_t MaxDTypeCodeOfMinor(uint16_t minor) {
  constexpr size_t n = std::size(kMaxCodeOfMinor);
  static_assert(kMaxCodeOfMinor[n - 1] == kMaxDTypeCode);
  return minor < n ? kMaxCodeOfMinor[minor] : kMaxDTypeCode;
}

uint16_t MinorVersionOfDType(DType dtype) {
  auto code = static_cast<uint16_t>(dtype);
  if (!IsValidDType(code)) return 0;
  uint16_t minor = 0;
  while (kMaxCodeOfMinor[minor] < code) ++minor;
  return minor;
}

uint32_t DTypeSize(DType dtype) {
  auto code = static_cast<uint16_t>(dtype);
  return code <= kMaxDTypeCode ? kTable[code].size : 0;
}

std::string_view DTypeName(DType dtype) {
  auto code = static_cast<uint16_t>(dtype);
  return code <= kMaxDTypeCode ? kTable[code].name : "invalid";
}

std::optional<DType> DTypeFromName(std::string_view name) {
  for (size_t i = 1; i < kTable.size(); ++i)
    if (kTable[i].name == name) return kTable[i].dtype;
  for (const Alias& a : kAliases)
    if (a.alias == name) return a.dtype;
  return std::nullopt;
}

std::optional<DType> DTypeFromStorageName(std::string_view storage_class) {
  constexpr std::string_view kSuffix = "Storage";
  if (storage_class.size() <= kSuffix.size() ||
      storage_class.substr(storage_class.size() - kSuffix.size()) != kSuffix)
    return std::nullopt;
  std::string_view prefix = storage_class.substr(0, storage_class.size() - kSuffix.size());
  for (size_t i = 1; i < kTable.size(); ++i)
    if (!kTable[i].storage_name.empty() && kTable[i].storage_name == prefix) return kTable[i].dtype;
  return std::nullopt;
}

}  // namespace zckpt
