// The DCP `.metadata` reader on hand-made pickles: only DCP's own classes are accepted, and
// malformed metadata is refused, not guessed at. (Metadata written by torch itself is read in
// tests/python/test_dcp.py.)
#include <gtest/gtest.h>

#include <string>

#include "pickle/dcp_metadata.h"
#include "zckpt/error.h"

namespace zckpt::pickle {
namespace {

using namespace std::string_literals;  // pickles hold NUL bytes

DcpMetadata Read(const std::string& p) {
  return ReadDcpMetadata({reinterpret_cast<const uint8_t*>(p.data()), p.size()}, "test.metadata");
}

void ExpectRefused(const std::string& p, ErrorKind kind, const std::string& why) {
  try {
    Read(p);
    FAIL() << "accepted; expected: " << why;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

const std::string kMeta = "ctorch.distributed.checkpoint.metadata\n";

TEST(DcpMetadata, MinimalMetadataReads) {
  // Metadata() with BUILD {'state_dict_metadata': {}, 'version': '1.0.0'}
  std::string p = "\x80\x02"s + kMeta + "Metadata\n)\x81}(X\x13\x00\x00\x00state_dict_metadata}X\x07\x00\x00\x00version"s
                  "X\x05\x00\x00\x00"s "1.0.0ub.";
  DcpMetadata md = Read(p);
  EXPECT_TRUE(md.items.empty());
  EXPECT_EQ(md.version, "1.0.0");
}

TEST(DcpMetadata, GlobalsOutsideDcpsClassesAreRefused) {
  ExpectRefused("\x80\x02"s "cposix\nsystem\n(X\x02\x00\x00\x00idtR."s, ErrorKind::kUnsafe, "posix.system");
  // A Metadata whose planner_data names numpy: not a code-running global, still not DCP's.
  std::string p = "\x80\x02"s + kMeta + "Metadata\n)\x81}(X\x13\x00\x00\x00state_dict_metadata}X\x0c\x00\x00\x00"s
                  "planner_datacnumpy\nones\n)Rub.";
  ExpectRefused(p, ErrorKind::kUnsafe, "numpy.ones");
}

TEST(DcpMetadata, OtherObjectsAreNotMetadata) {
  ExpectRefused("\x80\x02}q\x00."s, ErrorKind::kCorrupt, "not a torch.distributed.checkpoint Metadata");
  // state_dict_metadata holding a plain int where TensorStorageMetadata belongs.
  std::string p = "\x80\x02"s + kMeta + "Metadata\n)\x81}(X\x13\x00\x00\x00state_dict_metadata}X\x01\x00\x00\x00wK\x01sub."s;
  ExpectRefused(p, ErrorKind::kCorrupt, "entry 'w' is neither");
}

TEST(DcpMetadata, TheAllowlistIsDcpsClassesAndDtypes) {
  EXPECT_TRUE(IsDcpMetadataGlobal("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"));
  EXPECT_TRUE(IsDcpMetadataGlobal("torch", "bfloat16"));
  EXPECT_TRUE(IsDcpMetadataGlobal("torch", "Size"));
  EXPECT_FALSE(IsDcpMetadataGlobal("torch", "load"));
  EXPECT_FALSE(IsDcpMetadataGlobal("builtins", "eval"));
  EXPECT_FALSE(IsDcpMetadataGlobal("torch.distributed.checkpoint.metadata", "os"));
  // The memory-format enum's members as torch 2.4-2.9 pickle them (tools/ci/torch-matrix.sh
  // saves through zckpt.dcp under those torches), and nothing else of that name.
  EXPECT_TRUE(IsDcpMetadataGlobal("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT"));
  EXPECT_TRUE(IsDcpMetadataGlobal("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST"));
  EXPECT_FALSE(IsDcpMetadataGlobal("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING.__init__"));
}

}  // namespace
}  // namespace zckpt::pickle
