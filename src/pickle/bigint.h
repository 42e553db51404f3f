// Arbitrary-size integers as pickle stores them: little-endian two's complement bytes (the
// LONG1/LONG4 payload). Only conversions are needed; nothing here does arithmetic on values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zckpt::pickle {

// The value of a LONG1/LONG4 payload when it fits int64 (an empty payload is 0).
std::optional<int64_t> BigIntToInt64(std::string_view le_bytes);
// Decimal text of a two's complement little-endian payload ("-123", "0"). The conversion is
// quadratic (in 64-bit limbs, 19 digits a step), so a payload over kMaxDecimalBytes (about
// 2,500 digits) gives "<N-byte int>" instead (Python itself refuses int->str beyond 4,300 digits).
constexpr size_t kMaxDecimalBytes = 1024;
std::string BigIntToDecimal(std::string_view le_bytes);
// The most digits a decimal literal may have: Python's default int_max_str_digits, beyond which
// int() (so Python's own unpickler) refuses decimal text. The unpickler refuses longer INT/LONG
// literals before converting them.
constexpr size_t kMaxDecimalDigits = 4300;
// Parses optional sign + decimal digits into the minimal two's complement little-endian
// payload; nullopt when `text` is not of that form. Quadratic in the digits (19 a step): callers
// bound them (kMaxDecimalDigits).
std::optional<std::string> DecimalToBigInt(std::string_view text);

}  // namespace zckpt::pickle
