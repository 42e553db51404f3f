// The small conversions under the opcodes: big integers, protocol-0 text, float rendering.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "pickle/bigint.h"
#include "pickle/text_codec.h"
#include "pickle/value.h"

namespace zckpt::pickle {
namespace {

std::string Bytes(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(static_cast<char>(b));
  return s;
}

TEST(BigInt, RoundTripsThroughDecimal) {
  for (const char* text : {"0", "1", "-1", "127", "128", "-128", "-129", "255", "256", "9223372036854775807",
                           "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
                           "340282366920938463463374607431768211456", "-1000000000000000000000000000000"}) {
    auto le = DecimalToBigInt(text);
    ASSERT_TRUE(le) << text;
    EXPECT_EQ(BigIntToDecimal(*le), text);
  }
  EXPECT_EQ(*DecimalToBigInt("-128"), Bytes({0x80}));
  EXPECT_EQ(*DecimalToBigInt("128"), Bytes({0x80, 0x00}));
  EXPECT_EQ(*DecimalToBigInt("-129"), Bytes({0x7f, 0xff}));
  EXPECT_EQ(*DecimalToBigInt("0"), "");
  EXPECT_FALSE(DecimalToBigInt("12a"));
  EXPECT_FALSE(DecimalToBigInt("-"));
}

// The byte-at-a-time conversion the limb version replaced: slow, obviously right.
std::string NaiveDecimalToMagnitude(const std::string& digits) {
  std::string mag;  // little-endian
  for (char c : digits) {
    unsigned carry = static_cast<unsigned>(c - '0');
    for (char& b : mag) {
      unsigned v = static_cast<uint8_t>(b) * 10u + carry;
      b = static_cast<char>(v & 0xFF);
      carry = v >> 8;
    }
    if (carry) mag.push_back(static_cast<char>(carry));
  }
  while (!mag.empty() && mag.back() == 0) mag.pop_back();
  if (!mag.empty() && (static_cast<uint8_t>(mag.back()) & 0x80)) mag.push_back(0);
  return mag;
}

TEST(BigInt, LongNumbersMatchTheByteWiseConversion) {
  std::mt19937 rng(7);
  for (size_t len : {1, 18, 19, 20, 37, 38, 39, 100, 1000, 2400, 4300}) {
    std::string digits(len, '0');
    for (char& c : digits) c = static_cast<char>('0' + rng() % 10);
    digits[0] = static_cast<char>('1' + rng() % 9);
    auto le = DecimalToBigInt(digits);
    ASSERT_TRUE(le) << len;
    EXPECT_EQ(*le, NaiveDecimalToMagnitude(digits)) << len;
    if (le->size() <= kMaxDecimalBytes) {
      EXPECT_EQ(BigIntToDecimal(*le), digits);
      EXPECT_EQ(BigIntToDecimal(*DecimalToBigInt("-" + digits)), "-" + digits);
    }
  }
  EXPECT_EQ(BigIntToDecimal(*DecimalToBigInt("10000000000000000000")), "10000000000000000000");  // 10^19
  EXPECT_EQ(BigIntToDecimal(*DecimalToBigInt("100000000000000000000000000000000000000")),
            "100000000000000000000000000000000000000");  // 10^38: a zero 19-digit group
}

TEST(BigInt, Int64Range) {
  EXPECT_EQ(BigIntToInt64(""), 0);
  EXPECT_EQ(BigIntToInt64(Bytes({0xff})), -1);
  EXPECT_EQ(BigIntToInt64(Bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})), INT64_MAX);
  EXPECT_EQ(BigIntToInt64(Bytes({0, 0, 0, 0, 0, 0, 0, 0x80})), INT64_MIN);
  EXPECT_EQ(BigIntToInt64(Bytes({0, 0, 0, 0, 0, 0, 0, 0x80, 0xff})), INT64_MIN);  // sign-extended
  EXPECT_FALSE(BigIntToInt64(Bytes({0, 0, 0, 0, 0, 0, 0, 0x80, 0x00})));          // 2**63
  EXPECT_FALSE(BigIntToInt64(Bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff})));
}

TEST(TextCodec, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8("plain \xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"));
  EXPECT_TRUE(IsValidUtf8("\xed\xa0\x80"));  // a surrogate, as surrogatepass writes it
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));     // overlong
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe6\x97"));     // truncated
  EXPECT_FALSE(IsValidUtf8("\x80"));
  EXPECT_EQ(Utf8ToLatin1("a\xc3\xbf"), std::string("a\xff"));
  EXPECT_FALSE(Utf8ToLatin1("\xc4\x80"));    // U+0100
  EXPECT_EQ(Latin1ToUtf8("\xff"), "\xc3\xbf");
}

TEST(TextCodec, Protocol0Escapes) {
  std::string why;
  EXPECT_EQ(DecodeStringLine("'a\\tb\\\\c\\'d\\x41\\101\\q'", &why), std::string("a\tb\\c'dAA\\q"));
  EXPECT_EQ(DecodeStringLine("\"x\"", &why), std::string("x"));
  EXPECT_FALSE(DecodeStringLine("'x\"", &why));
  EXPECT_EQ(DecodeRawUnicodeEscape("\\u00e9\\U0001f600\\\\u0041", &why), std::string("\xc3\xa9\xf0\x9f\x98\x80\\\\u0041"));
  EXPECT_EQ(DecodeRawUnicodeEscape("\xe9", &why), std::string("\xc3\xa9"));  // latin-1 byte
  EXPECT_FALSE(DecodeRawUnicodeEscape("\\U00110000", &why));
  EXPECT_EQ(ParseDecimalInt64(" -42 "), -42);
  EXPECT_FALSE(ParseDecimalInt64("99999999999999999999"));
  EXPECT_EQ(ParseFloatText("1e400"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(ParseFloatText("-1e-400"), -0.0);
  EXPECT_TRUE(std::isnan(*ParseFloatText("nan")));
}

TEST(FormatFloat, MatchesPythonRepr) {
  EXPECT_EQ(FormatFloat(0.0), "0.0");
  EXPECT_EQ(FormatFloat(-0.0), "-0.0");
  EXPECT_EQ(FormatFloat(1.5), "1.5");
  EXPECT_EQ(FormatFloat(100.0), "100.0");
  EXPECT_EQ(FormatFloat(1e15), "1000000000000000.0");
  EXPECT_EQ(FormatFloat(1e16), "1e+16");
  EXPECT_EQ(FormatFloat(1.25e16), "1.25e+16");
  EXPECT_EQ(FormatFloat(0.0001), "0.0001");
  EXPECT_EQ(FormatFloat(0.00001), "1e-05");
  EXPECT_EQ(FormatFloat(0.1), "0.1");
  EXPECT_EQ(FormatFloat(5e-324), "5e-324");
  EXPECT_EQ(FormatFloat(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(FormatFloat(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(FormatFloat(std::nan("")), "nan");
}

}  // namespace
}  // namespace zckpt::pickle
