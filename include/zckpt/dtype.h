// Element types of tensors and storages, with the codes the .zckpt format stores.
//
// The codes are zckpt's own (format-spec/zckpt-v1.md, "Dtype codes"), not c10::ScalarType's,
// so the byte format never depends on a torch release. Names are torch's attribute names
// (`torch.<name>`), which is also how a pickle spells a dtype GLOBAL.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace zckpt {

enum class DType : uint16_t {
  kInvalid = 0,
  kBool = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kInt16 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kUInt16 = 7,
  kUInt32 = 8,
  kUInt64 = 9,
  kFloat16 = 10,
  kBFloat16 = 11,
  kFloat32 = 12,
  kFloat64 = 13,
  kComplex32 = 14,
  kComplex64 = 15,
  kComplex128 = 16,
  kFloat8_e4m3fn = 17,
  kFloat8_e5m2 = 18,
  kFloat8_e4m3fnuz = 19,
  kFloat8_e5m2fnuz = 20,
  kFloat8_e8m0fnu = 21,
  kFloat4_e2m1fn_x2 = 22,
  kQInt8 = 23,
  kQUInt8 = 24,
  kQInt32 = 25,
  kQUInt4x2 = 26,
  kQUInt2x4 = 27,
  kBits1x8 = 28,
  kBits2x4 = 29,
  kBits4x2 = 30,
  kBits8 = 31,
  kBits16 = 32,
  kUInt1 = 33,  // uint1..uint7: torch "shell" dtypes, one byte per element as torch reports
  kUInt2 = 34,
  kUInt3 = 35,
  kUInt4 = 36,
  kUInt5 = 37,
  kUInt6 = 38,
  kUInt7 = 39,
  kInt1 = 40,  // int1..int7: likewise
  kInt2 = 41,
  kInt3 = 42,
  kInt4 = 43,
  kInt5 = 44,
  kInt6 = 45,
  kInt7 = 46,
  kBComplex32 = 47,  // complex of two bfloat16 (torch 2.15+); container format 1.1 onwards
};

constexpr uint16_t kMaxDTypeCode = 47;

// Container format versions add dtype codes (spec §6, §9): 1.0 defines codes 1-46, 1.1 adds 47.
// The highest code format version 1.`minor` defines (minors above the newest known: kMaxDTypeCode).
uint16_t MaxDTypeCodeOfMinor(uint16_t minor);
// The lowest minor version of format 1 that defines `dtype` (0 for an invalid code).
uint16_t MinorVersionOfDType(DType dtype);

// True for every code listed above except kInvalid.
bool IsValidDType(uint16_t code);
// Bytes per element (itemsize); 0 for kInvalid.
uint32_t DTypeSize(DType dtype);
// torch's name ("float32", "bfloat16", "float8_e4m3fn"); "invalid" for kInvalid.
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName; also accepts torch's aliases (float, double, half, long, int, short,
// cfloat, cdouble, chalf). nullopt for anything else.
std::optional<DType> DTypeFromName(std::string_view name);
// Element type of a typed storage class name as pickled by torch ("FloatStorage",
// "BFloat16Storage", "QInt8Storage", ...); nullopt when the name is not a typed storage.
// "UntypedStorage" is not typed: callers treat it as bytes (kUInt8).
std::optional<DType> DTypeFromStorageName(std::string_view storage_class);

}  // namespace zckpt
