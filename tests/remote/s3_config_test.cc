// S3 configuration as the AWS tools read it, and the URLs it gives (path-style for custom
// endpoints, virtual-host for AWS).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "remote/s3.h"
#include "remote/s3_client.h"
#include "zckpt/error.h"

namespace zckpt::remote {
namespace {

class S3ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                          "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "ZCKPT_S3_ADDRESSING",
                          "ZCKPT_S3_ATTEMPTS"})
      unsetenv(v);
    dir_ = std::filesystem::temp_directory_path() / ("zckpt-s3conf-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    setenv("AWS_SHARED_CREDENTIALS_FILE", (dir_ / "credentials").c_str(), 1);
    setenv("AWS_CONFIG_FILE", (dir_ / "config").c_str(), 1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const char* name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::filesystem::path dir_;
};

TEST_F(S3ConfigTest, EnvironmentWins) {
  Write("credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = FILESECRET\n");
  setenv("AWS_ACCESS_KEY_ID", "ENVKEY", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET", 1);
  setenv("AWS_SESSION_TOKEN", "TOKEN", 1);
  setenv("AWS_REGION", "eu-west-3", 1);
  S3Config c = LoadS3Config();
  EXPECT_EQ(c.access_key, "ENVKEY");
  EXPECT_EQ(c.secret_key, "ENVSECRET");
  EXPECT_EQ(c.session_token, "TOKEN");
  EXPECT_EQ(c.region, "eu-west-3");
  EXPECT_FALSE(c.path_style);
  EXPECT_EQ(S3Client(c).Url("bkt", "a/b c.zckpt", ""), "https://bkt.s3.eu-west-3.amazonaws.com/a/b%20c.zckpt");
}

TEST_F(S3ConfigTest, ProfileFromFiles) {
  Write("credentials", "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
                       "[train]\naws_access_key_id = T\naws_secret_access_key = TS\naws_session_token = TT\n");
  Write("config", "[default]\nregion = us-west-2\n[profile train]\nregion = ap-south-1\n"
                  "endpoint_url = http://127.0.0.1:9000/\n");
  S3Config d = LoadS3Config();
  EXPECT_EQ(d.access_key, "D");
  EXPECT_EQ(d.region, "us-west-2");
  EXPECT_TRUE(d.endpoint.empty());
  setenv("AWS_PROFILE", "train", 1);
  S3Config t = LoadS3Config();
  EXPECT_EQ(t.access_key, "T");
  EXPECT_EQ(t.secret_key, "TS");
  EXPECT_EQ(t.session_token, "TT");
  EXPECT_EQ(t.region, "ap-south-1");
  EXPECT_EQ(t.endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(t.path_style);  // a custom endpoint: path-style
  EXPECT_EQ(S3Client(t).Url("bkt", "k.zckpt", "uploads="), "http://127.0.0.1:9000/bkt/k.zckpt?uploads=");
}

TEST_F(S3ConfigTest, AddressingOverride) {
  setenv("AWS_ENDPOINT_URL", "http://minio.local:9000", 1);
  setenv("ZCKPT_S3_ADDRESSING", "virtual", 1);
  S3Config c = LoadS3Config();
  EXPECT_FALSE(c.path_style);
  EXPECT_EQ(S3Client(c).Url("bkt", "k", ""), "http://bkt.minio.local:9000/k");
  setenv("ZCKPT_S3_ADDRESSING", "sideways", 1);
  EXPECT_THROW(LoadS3Config(), Error);
}

TEST(ObjectUrl, Parse) {
  EXPECT_TRUE(IsObjectUrl("s3://b/k"));
  EXPECT_FALSE(IsObjectUrl("/tmp/s3://b"));
  ObjectLocation l = ParseObjectUrl("s3://bucket/dir/model.zckpt");
  EXPECT_EQ(l.bucket, "bucket");
  EXPECT_EQ(l.key, "dir/model.zckpt");
  EXPECT_THROW(ParseObjectUrl("s3://bucket"), Error);
  EXPECT_THROW(ParseObjectUrl("s3:///key"), Error);
}

// Parts stay small (the upload's tail is its last parts at one connection's speed) until S3's
// 10000 parts would not hold the object; a base under S3's 5 MiB least is raised to it.
TEST(UploadParts, SmallThenDoubledSoTenThousandHoldALargeObject) {
  constexpr uint64_t MiB = 1 << 20;
  EXPECT_EQ(UploadPartBytes(5 * MiB, 2), 5 * MiB);
  EXPECT_EQ(UploadPartBytes(5 * MiB, 2001), 5 * MiB);
  EXPECT_EQ(UploadPartBytes(5 * MiB, 2002), 10 * MiB);
  EXPECT_EQ(UploadPartBytes(1 * MiB, 2), 5 * MiB);
  EXPECT_EQ(UploadPartBytes(8 * MiB, 2), 8 * MiB);
  uint64_t held = 5 * MiB;  // part 1
  for (int n = 2; n <= 10000; ++n) {
    EXPECT_LE(UploadPartBytes(5 * MiB, n), 5ull << 30) << "part " << n << " over S3's 5 GiB";
    held += UploadPartBytes(5 * MiB, n);
  }
  EXPECT_GE(held, 300ull << 30);
}

}  // namespace
}  // namespace zckpt::remote
