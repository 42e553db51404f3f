// Text conversions the pickle opcodes need: UTF-8 checks, the escape codes of protocol 0's
// STRING/UNICODE lines, and the latin-1 mapping behind torch's `_codecs.encode` bytes idiom.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zckpt::pickle {

// True when `s` is UTF-8 as Python's "surrogatepass" handler accepts it (well-formed, shortest
// form, <= U+10FFFF; encoded surrogates allowed, which is how pickle carries lone ones).
bool IsValidUtf8(std::string_view s);
// Appends the UTF-8 (surrogatepass) encoding of `code_point` (<= 0x10FFFF).
void AppendUtf8(std::string& out, uint32_t code_point);
// UTF-8 text -> one byte per code point when all are <= 0xFF (str.encode('latin1')).
std::optional<std::string> Utf8ToLatin1(std::string_view utf8);
// Latin-1 bytes -> UTF-8 (bytes.decode('latin1')).
std::string Latin1ToUtf8(std::string_view bytes);

// The payload of a protocol-0 STRING line: a quoted Python 2 repr, undone like
// codecs.escape_decode (\\ \' \" \n \t \r \a \b \f \v \xNN \ooo, backslash-newline).
// nullopt (with *why set) when unquoted or malformed.
std::optional<std::string> DecodeStringLine(std::string_view line, std::string* why);
// The payload of a protocol-0 UNICODE line: raw-unicode-escape (\uXXXX, \UXXXXXXXX; every
// other byte is a latin-1 code point), returned as UTF-8.
std::optional<std::string> DecodeRawUnicodeEscape(std::string_view line, std::string* why);

// Decimal integer as protocol 0 writes it (INT, LONG, GET, PUT): optional sign, digits.
std::optional<int64_t> ParseDecimalInt64(std::string_view text);
// A FLOAT line: Python float() syntax (decimal/exponent, nan, inf, surrounding spaces).
std::optional<double> ParseFloatText(std::string_view text);

}  // namespace zckpt::pickle
