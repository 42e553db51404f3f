// checkpoint/folder.h on local folders: what verify, merge and convert walk and write with.
#include "checkpoint/folder.h"

#include <sys/stat.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "test_util.h"
#include "zckpt/error.h"

namespace zckpt::checkpoint {
namespace {

using testing::TempDir;
using testing::WriteFileBytes;

std::vector<std::string> Names(const std::vector<FolderFile>& files) {
  std::vector<std::string> out;
  for (const FolderFile& f : files) out.push_back(f.name);
  return out;
}

TEST(Folder, JoinsWithOneSlash) {
  EXPECT_EQ(InFolder("s3://b/p/", "x.zckpt"), "s3://b/p/x.zckpt");
  EXPECT_EQ(InFolder("s3://b/p", "a/x.zckpt"), "s3://b/p/a/x.zckpt");
  EXPECT_EQ(InFolder("dir", ".metadata"), "dir/.metadata");
  EXPECT_EQ(WithoutTrailingSlash("s3://b/p//"), "s3://b/p");
  EXPECT_EQ(WithoutTrailingSlash("/"), "/");
  EXPECT_TRUE(IsRemote("s3://b/k"));
  EXPECT_FALSE(IsRemote("b/k"));
}

TEST(Folder, ListsRegularFilesSortedLeavingOutTemporariesAndFifos) {
  TempDir dir;
  std::filesystem::create_directories(dir.File("sub/deeper"));
  WriteFileBytes(dir.File("b.zckpt"), {1, 2, 3});
  WriteFileBytes(dir.File("a.json"), {1});
  WriteFileBytes(dir.File("sub/c.zckpt"), {1, 2});
  WriteFileBytes(dir.File("sub/deeper/d"), {});
  WriteFileBytes(dir.File(".b.zckpt.zckpt-tmp-1-0123456789abcdef"), {9});
  ASSERT_EQ(::mkfifo(dir.File("pipe").c_str(), 0600), 0);
  std::filesystem::create_directory_symlink(dir.File("sub"), dir.File("link"));  // not walked
  TempDir blobs;  // a Hugging Face cache: the snapshot's files are links into blobs/
  WriteFileBytes(blobs.File("0123abcd"), {5, 6});
  std::filesystem::create_symlink(blobs.File("0123abcd"), dir.File("sub/linked.safetensors"));

  EXPECT_EQ(Names(FolderFiles(dir.path(), false)), (std::vector<std::string>{"a.json", "b.zckpt"}));
  std::vector<FolderFile> all = FolderFiles(dir.path(), true);
  EXPECT_EQ(Names(all), (std::vector<std::string>{"a.json", "b.zckpt", "sub/c.zckpt", "sub/deeper/d", "sub/linked.safetensors"}));
  EXPECT_EQ(all[1].size, 3u);
  EXPECT_EQ(all[4].size, 2u);
  EXPECT_EQ(Names(FolderFiles(dir.path() + "/", true)), Names(all));
  EXPECT_TRUE(IsFolder(dir.path()));
  EXPECT_FALSE(IsFolder(dir.File("a.json")));
  EXPECT_TRUE(FileExists(dir.File("a.json")));
  EXPECT_FALSE(FileExists(dir.File("pipe")));
  EXPECT_FALSE(FileExists(dir.File("sub")));
  EXPECT_THROW(FolderFiles(dir.File("missing"), false), Error);
}

TEST(Folder, OutputFileShowsNothingUntilCommitAndCopiesWhole) {
  TempDir dir;
  {
    OutputFile f(dir.File("out.bin"));
    f.Write("abc", 3);
    EXPECT_FALSE(FileExists(dir.File("out.bin")));
  }  // destroyed before Commit: nothing there
  EXPECT_FALSE(FileExists(dir.File("out.bin")));
  WriteWholeFile(dir.File("out.bin"), "hello");
  EXPECT_EQ(ReadWholeFile(dir.File("out.bin")), "hello");
  EXPECT_THROW(ReadWholeFile(dir.File("out.bin"), 4), Error);
  CopyFileTo(dir.File("out.bin"), dir.File("copy.bin"));
  EXPECT_EQ(ReadWholeFile(dir.File("copy.bin")), "hello");
  EXPECT_EQ(OpenMappedFile(dir.File("copy.bin"), "a file")->size(), 5u);
}

TEST(Folder, AnObjectWhoseParserNeedsAMappingIsRefusedNamingIt) {
  try {
    OpenMappedFile("s3://bucket/actor/model_world_size_2_rank_0.pt", "a torch.save (.pt) rank file");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    std::string msg = e.what();
    EXPECT_NE(msg.find("s3://bucket/actor/model_world_size_2_rank_0.pt"), std::string::npos) << msg;
    EXPECT_NE(msg.find("zckpt convert"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace zckpt::checkpoint
