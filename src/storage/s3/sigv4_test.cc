// The signer against AWS's published examples ("Signature Calculations for the Authorization
// Header: Transferring Payload in a Single Chunk", S3 API reference), and the environment's
// configuration as the AWS tools read it.
#include "storage/s3/sigv4.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <utility>

#include "storage/s3/s3_config.h"

namespace dcp::storage::s3 {
namespace {

const SigningKey kKey{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                      "us-east-1"};
const std::string kEmptySha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST(SigV4, GetObjectExample) {
  RequestToSign r;
  r.method = "GET";
  r.path = "/test.txt";
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"Range", "bytes=0-9"},
               {"x-amz-content-sha256", kEmptySha},
               {"x-amz-date", "20130524T000000Z"}};
  r.payload_sha256 = kEmptySha;
  EXPECT_EQ(Sha256Hex(CanonicalRequest(r)),
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(Authorization(r, kKey, "20130524T000000Z"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4, ListObjectsExampleSortsAndEncodesTheQuery) {
  RequestToSign r;
  r.method = "GET";
  r.path = "/";
  r.query = {{"prefix", "J"}, {"max-keys", "2"}};  // out of order: the signer sorts
  r.headers = {{"host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-content-sha256", kEmptySha},
               {"x-amz-date", "20130524T000000Z"}};
  r.payload_sha256 = kEmptySha;
  EXPECT_EQ(CanonicalQuery(r.query), "max-keys=2&prefix=J");
  EXPECT_NE(Authorization(r, kKey, "20130524T000000Z")
                .find("Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
            std::string::npos);
}

TEST(SigV4, UriEncoding) {
  EXPECT_EQ(UriEncode("a b/c~d_e.f-g", true), "a%20b/c~d_e.f-g");
  EXPECT_EQ(UriEncode("a/b+c=", false), "a%2Fb%2Bc%3D");
  EXPECT_EQ(CanonicalQuery({{"uploads", ""}}), "uploads=");
}

TEST(S3Config, ParsesPaths) {
  auto loc = ParseS3Path("s3://bucket/a/b/");
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc->bucket, "bucket");
  EXPECT_EQ(loc->key, "a/b");
  EXPECT_EQ(ParseS3Path("s3://b")->key, "");
  EXPECT_FALSE(ParseS3Path("s3:///x").ok());
  EXPECT_FALSE(ParseS3Path("/local/dir").ok());
  // Dot and empty segments: refused (curl would send another key than the one signed).
  for (const char* p :
       {"s3://bkt/a/../b", "s3://bkt/./a", "s3://bkt/a/..", "s3://bkt/a//b", "s3://bkt/.."}) {
    auto bad = ParseS3Path(p);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << p;
    EXPECT_NE(bad.status().message().find(p), std::string::npos) << bad.status().message();
  }
  EXPECT_EQ(ParseS3Path("s3://bkt/a.b/..c/c..")->key, "a.b/..c/c..");
}

// Parts grow with the upload: 10,000 parts hold more than S3's 5 TiB object limit, none over
// 5 GiB, and the first 1,000 are the configured size.
TEST(S3Config, PartsGrowToStayUnderTheirLimit) {
  const uint64_t base = uint64_t{16} << 20;
  uint64_t total = 0;
  for (size_t i = 0; i < kMaxParts; ++i) {
    const uint64_t p = PartBytes(base, i);
    EXPECT_LE(p, uint64_t{5} << 30) << i;
    EXPECT_GE(p, base) << i;
    total += p;
  }
  EXPECT_GT(total, uint64_t{5} << 40);
  EXPECT_EQ(PartBytes(base, 999), base);
  EXPECT_EQ(PartBytes(base, 1000), 2 * base);
  EXPECT_EQ(PartBytes(uint64_t{5} << 30, 9999), uint64_t{5} << 30);
}

// A transfer of known size takes one part per connection, between the configured part size
// and four times it: a large file costs 16 requests per GiB at the default, a small one still
// spreads over every connection.
TEST(S3Config, KnownSizesTakeOnePartPerConnectionWithinFourTimesThePartSize) {
  S3Config c;  // 16 MiB, 8 connections
  const uint64_t MiB = uint64_t{1} << 20;
  EXPECT_EQ(PartBytesFor(c, 0), 16 * MiB);
  EXPECT_EQ(PartBytesFor(c, 100 * MiB), 16 * MiB);
  EXPECT_EQ(PartBytesFor(c, 200 * MiB), 25 * MiB);  // 25 MiB per connection
  EXPECT_EQ(PartBytesFor(c, 201 * MiB), 26 * MiB);  // rounded up to whole MiB
  EXPECT_EQ(PartBytesFor(c, 512 * MiB), 64 * MiB);
  EXPECT_EQ(PartBytesFor(c, uint64_t{1} << 40), 64 * MiB);
  c.connections = 1;
  EXPECT_EQ(PartBytesFor(c, 40 * MiB), 40 * MiB);
  c.part_bytes = 5 * MiB;
  EXPECT_EQ(PartBytesFor(c, 40 * MiB), 20 * MiB);
  c.part_bytes = uint64_t{5} << 30;  // DCP_S3_PART_MB=5120: never past S3's 5 GiB part
  EXPECT_EQ(PartBytesFor(c, uint64_t{1} << 40), uint64_t{5} << 30);
  EXPECT_EQ(PartBytes(PartBytesFor(c, uint64_t{1} << 40), 5000), uint64_t{5} << 30);
}

TEST(S3Config, ReadsProfilesOfTheSharedFiles) {
  const std::string text =
      "[default]\naws_access_key_id = AK1\n\n[other]\n# comment\naws_access_key_id=AK2 \n"
      "region = eu-west-1\n";
  EXPECT_EQ(IniValue(text, "default", "aws_access_key_id"), "AK1");
  EXPECT_EQ(IniValue(text, "other", "aws_access_key_id"), "AK2");
  EXPECT_EQ(IniValue(text, "other", "region"), "eu-west-1");
  EXPECT_EQ(IniValue(text, "missing", "region"), "");
}

// The environment wins over the files; the profile's files fill in what it lacks; custom
// endpoints are path-style.
TEST(S3Config, ResolvesLikeTheAwsCli) {
  const std::string dir = ::testing::TempDir();
  {
    std::ofstream(dir + "/creds")
        << "[p]\naws_access_key_id = FILEKEY\naws_secret_access_key = S\n";
    std::ofstream(dir + "/config") << "[profile p]\nregion = ap-south-1\n";
  }
  for (const char* v : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                        "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                        "AWS_ENDPOINT_URL_S3", "DCP_S3_ADDRESSING", "DCP_S3_PART_MB"}) {
    ::unsetenv(v);
  }
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", (dir + "/creds").c_str(), 1);
  ::setenv("AWS_CONFIG_FILE", (dir + "/config").c_str(), 1);
  ::setenv("AWS_PROFILE", "p", 1);
  auto c = S3ConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->credentials.access_key, "FILEKEY");
  EXPECT_EQ(c->region, "ap-south-1");
  EXPECT_FALSE(c->path_style);  // AWS itself: virtual-hosted
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
  ::setenv("AWS_REGION", "us-west-2", 1);
  c = S3ConfigFromEnvironment();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(c->region, "us-west-2");
  EXPECT_TRUE(c->path_style);
  // A scheme's default port is dropped (curl leaves it out of Host; the signature must too).
  for (auto [given, used] : {std::pair{"http://minio:80", "http://minio"},
                             std::pair{"https://s3.example:443/", "https://s3.example"},
                             std::pair{"http://minio:443", "http://minio:443"},
                             std::pair{"https://minio:8443", "https://minio:8443"}}) {
    ::setenv("AWS_ENDPOINT_URL", given, 1);
    c = S3ConfigFromEnvironment();
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->endpoint, used) << given;
  }
  ::setenv("DCP_S3_PART_MB", "1", 1);
  EXPECT_EQ(S3ConfigFromEnvironment().status().code(), StatusCode::kInvalidArgument);
  ::setenv("AWS_PROFILE", "nobody", 1);
  ::unsetenv("DCP_S3_PART_MB");
  auto none = S3ConfigFromEnvironment();
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no S3 credentials"), std::string::npos);
  for (const char* v : {"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_PROFILE",
                        "AWS_ENDPOINT_URL", "AWS_REGION"}) {
    ::unsetenv(v);
  }
}

}  // namespace
}  // namespace dcp::storage::s3
