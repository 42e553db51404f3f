// A corpus of malformed safetensors files, each refused with the right kind and a message that
// says what is wrong; the same bytes handed to the converter are refused the same way and leave
// nothing behind. Built here byte by byte: no Python needed.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "safetensors/header.h"
#include "test_util.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt::safetensors {
namespace {

std::vector<uint8_t> File(const std::string& json, size_t data_bytes = 0, uint64_t declared = UINT64_MAX) {
  uint64_t n = declared == UINT64_MAX ? json.size() : declared;
  std::vector<uint8_t> out(8);
  for (int b = 0; b < 8; ++b) out[b] = static_cast<uint8_t>(n >> (8 * b));
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + data_bytes, 0x5a);
  return out;
}

struct Case {
  const char* name;
  std::vector<uint8_t> bytes;
  ErrorKind kind;
  const char* fragment;
};

std::vector<Case> Corpus() {
  const std::string f32x2 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::string deep = R"({"a":{"dtype":"F32","shape":)" + std::string(100000, '[');
  std::string dims = R"({"a":{"dtype":"U8","shape":[)";
  for (int i = 0; i < 65; ++i) dims += (i ? ",1" : "1");
  dims += R"(],"data_offsets":[0,1]}})";
  return {
      {"too_short", {1, 2, 3}, ErrorKind::kNotContainer, "too short to be a safetensors file"},
      {"huge_header_length", File("{}", 0, 1ull << 63), ErrorKind::kCorrupt, "exceeds safetensors' limit of 100000000"},
      {"header_length_just_over_limit", File("{}", 0, 100000001), ErrorKind::kCorrupt, "exceeds safetensors' limit"},
      {"header_past_end", File("{}", 0, 4096), ErrorKind::kCorrupt, "runs past the end of the file"},
      {"bad_json", File(R"({"a":{"dtype":"F32",)"), ErrorKind::kCorrupt, "not valid JSON"},
      {"trailing_garbage", File("{} x"), ErrorKind::kCorrupt, "not valid JSON"},
      {"nul_padding", File(std::string("{}\0\0\0\0\0\0", 8)), ErrorKind::kCorrupt, "not valid JSON"},
      {"not_utf8", File("{\"\xff\":{}}"), ErrorKind::kCorrupt, "not UTF-8 (byte 2 of the header, file byte 10)"},
      {"overlong_utf8", File("{\"\xc0\xaf\":1}"), ErrorKind::kCorrupt, "not UTF-8"},
      {"surrogate_utf8", File("{\"\xed\xa0\x80\":1}"), ErrorKind::kCorrupt, "not UTF-8"},
      {"truncated_utf8", File("{\"\xe2\x82"), ErrorKind::kCorrupt, "not UTF-8"},
      {"not_an_object", File("[{}]"), ErrorKind::kCorrupt, "does not start with '{'"},
      {"leading_space", File(" {}"), ErrorKind::kCorrupt, "does not start with '{'"},
      {"empty_header", File("", 0), ErrorKind::kCorrupt, "does not start with '{'"},
      {"duplicate_tensor", File("{" + f32x2 + "," + f32x2 + "}", 8), ErrorKind::kCorrupt, "key 'a' appears twice"},
      {"duplicate_metadata_key", File(R"({"__metadata__":{"k":"1","k":"2"}})"), ErrorKind::kCorrupt,
       "__metadata__ key 'k' appears twice"},
      {"duplicate_field", File(R"({"a":{"dtype":"F32","dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4),
       ErrorKind::kCorrupt, "has 'dtype' twice"},
      {"missing_offsets", File(R"({"a":{"dtype":"F32","shape":[2]}})", 8), ErrorKind::kCorrupt, "has no 'data_offsets'"},
      {"missing_dtype", File(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), ErrorKind::kCorrupt, "has no 'dtype'"},
      {"unknown_field", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"byteorder":"big"}})", 8),
       ErrorKind::kUnsupported, "field 'byteorder' that safetensors does not define"},
      {"unknown_dtype", File(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16), ErrorKind::kUnsupported,
       "dtype 'F128', which safetensors does not define"},
      {"dtype_torch_lacks", File(R"({"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3),
       ErrorKind::kUnsupported, "F6_E2M3, which torch has no type for"},
      {"dtype_not_string", File(R"({"a":{"dtype":12,"shape":[2],"data_offsets":[0,8]}})", 8), ErrorKind::kCorrupt,
       "'dtype' of tensor 'a' is a number"},
      {"negative_offset", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8), ErrorKind::kCorrupt,
       "holds -8, not a non-negative integer"},
      {"float_offset", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", 8), ErrorKind::kCorrupt,
       "holds 8.0, not a non-negative integer"},
      {"offset_beyond_u64", File(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,18446744073709551616]}})"),
       ErrorKind::kCorrupt, "not a non-negative integer"},
      {"three_offsets", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", 8), ErrorKind::kCorrupt,
       "holds more than two numbers"},
      {"one_offset", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", 8), ErrorKind::kCorrupt,
       "holds 1 numbers, not two"},
      {"negative_dim", File(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), ErrorKind::kCorrupt,
       "shape of tensor 'a' holds -2"},
      {"overlapping_offsets",
       File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       ErrorKind::kCorrupt, "tensor 'b' has data_offsets [4, 12] (file bytes"},
      {"overlap_says_so",
       File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       ErrorKind::kCorrupt, "the previous tensor 'a' ends at 8: the tensors overlap"},
      {"same_offsets_twice",
       File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
       ErrorKind::kCorrupt, "overlap"},
      {"gap", File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
       ErrorKind::kCorrupt, "a gap no tensor covers"},
      {"first_not_at_zero", File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), ErrorKind::kCorrupt,
       "the byte buffer starts at 0"},
      {"size_mismatch", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4), ErrorKind::kCorrupt,
       "(4 bytes), but F32 x [2] is 8 bytes"},
      {"end_before_begin", File(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), ErrorKind::kCorrupt,
       "END before BEGIN"},
      {"sizes_past_end", File("{" + f32x2 + "}", 4), ErrorKind::kCorrupt,
       "cover 8 bytes of data but the file holds 4 (tensor 'a' runs past the end of the file)"},
      {"bytes_after_last_tensor", File("{" + f32x2 + "}", 12), ErrorKind::kCorrupt, "that no tensor covers"},
      {"data_without_tensors", File("{}", 1), ErrorKind::kCorrupt, "that no tensor covers"},
      {"shape_overflow", File(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
       ErrorKind::kCorrupt, "overflows 64 bits"},
      {"strides_overflow", File(R"({"a":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})"),
       ErrorKind::kUnsupported, "strides overflow"},
      {"dim_beyond_int64", File(R"({"a":{"dtype":"U8","shape":[0,9223372036854775808],"data_offsets":[0,0]}})"),
       ErrorKind::kUnsupported, "beyond what torch holds"},
      {"f4_odd_last_dim", File(R"({"a":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}})", 3), ErrorKind::kUnsupported,
       "the last dimension must be even"},
      {"f4_half_byte", File(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 1), ErrorKind::kCorrupt,
       "12 bits, not a whole number of bytes"},
      {"too_many_dims", File(dims, 1), ErrorKind::kUnsupported, "more than 64 dimensions"},
      {"metadata_value_not_string", File(R"({"__metadata__":{"k":1}})"), ErrorKind::kCorrupt, "__metadata__ 'k' is a number"},
      {"metadata_nested", File(R"({"__metadata__":{"k":{"x":"y"}}})"), ErrorKind::kCorrupt, "__metadata__ 'k' is an object"},
      {"metadata_array", File(R"({"__metadata__":["k"]})"), ErrorKind::kCorrupt, "__metadata__ is an array, not an object of strings"},
      {"entry_not_object", File(R"({"a":5})"), ErrorKind::kCorrupt, "the entry of tensor 'a' is a number, not an object"},
      {"shape_of_arrays", File(deep), ErrorKind::kCorrupt, "shape of tensor 'a' holds an array"},
      {"control_bytes_in_name", File("{\"a\\u0001b\":5}"), ErrorKind::kCorrupt, "tensor 'a\\x01b'"},
  };
}

::testing::AssertionResult Refused(const std::function<void()>& fn, ErrorKind kind, const std::string& fragment) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.kind() != kind)
      return ::testing::AssertionFailure() << "kind " << ErrorKindName(e.kind()) << ", expected " << ErrorKindName(kind)
                                           << ": " << e.what();
    if (std::string(e.what()).find(fragment) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << fragment << "': " << e.what();
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "accepted";
}

TEST(SafetensorsMalformed, EveryCaseIsRefusedSayingWhy) {
  for (const Case& c : Corpus()) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(Refused([&] { ParseFile(c.bytes, "bad.safetensors"); }, c.kind, c.fragment));
    EXPECT_TRUE(Refused([&] { ParseFile(c.bytes, "bad.safetensors"); }, c.kind, "bad.safetensors"));
  }
}

TEST(SafetensorsMalformed, TheConverterRefusesThemAndWritesNothing) {
  zckpt::testing::TempDir dir;
  for (const Case& c : Corpus()) {
    SCOPED_TRACE(c.name);
    const std::string src = dir.File(std::string(c.name) + ".safetensors"), dst = dir.File("out.zckpt");
    zckpt::testing::WriteFileBytes(src, c.bytes);
    EXPECT_TRUE(Refused([&] { ConvertFile(src, dst, {}); }, c.kind, c.fragment));
    EXPECT_FALSE(zckpt::testing::FileExists(dst));
    std::remove(src.c_str());
    EXPECT_EQ(zckpt::testing::ListDir(dir.path()), std::vector<std::string>{});  // no temporary left
  }
}

TEST(SafetensorsMalformed, EdgeCasesTheFormatAllows) {
  // Several empty tensors at one offset, a 0-dim tensor, "__metadata__": null, whitespace
  // padding, names with escapes: all valid.
  auto h = ParseFile(File(R"({"__metadata__":null,"e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                          R"("s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                          R"("e2":{"dtype":"I8","shape":[3,0],"data_offsets":[0,0]},"n\u00e9\n":{"dtype":"BOOL","shape":[1],"data_offsets":[8,9]}}   )",
                          9),
                     "ok");
  EXPECT_FALSE(h.has_metadata);
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "e1");  // ties keep header order
  EXPECT_EQ(h.tensors[1].name, "e2");
  EXPECT_EQ(h.tensors[2].name, "s");
  EXPECT_EQ(h.tensors[3].name, "n\xc3\xa9\n");
  EXPECT_EQ(h.data_bytes, 9u);
  auto empty = ParseFile(File("{}      "), "empty");
  EXPECT_TRUE(empty.tensors.empty());
  EXPECT_EQ(empty.data_bytes, 0u);
}

}  // namespace
}  // namespace zckpt::safetensors
