// The default credential chain's local sources, their order, expiry and refresh timing. The
// endpoints (STS, container, instance metadata) are tested against real servers in
// python/tests/test_s3_credentials.py.
#include "storage/s3/credentials.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

namespace dcp::storage::s3 {
namespace {

// Clears every variable the chain reads for one test, and restores nothing: the tests of this
// binary never use S3 from the environment.
struct CleanAwsEnvironment {
  CleanAwsEnvironment() {
    for (const char* v :
         {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
          "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
          "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
          "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS"}) {
      ::unsetenv(v);
    }
    ::setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
  }
  ~CleanAwsEnvironment() {
    for (const char* v : {"AWS_EC2_METADATA_DISABLED", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                          "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"}) {
      ::unsetenv(v);
    }
  }
};

AwsProfile Profile(const std::string& credentials, const std::string& config) {
  return AwsProfile{"p", credentials, config};
}

TEST(Credentials, Iso8601Times) {
  EXPECT_EQ(ParseIso8601("1970-01-01T00:01:40Z"), 100);
  EXPECT_EQ(ParseIso8601("2026-12-05T14:03:00Z"), 1796479380);
  EXPECT_EQ(ParseIso8601("2026-12-05T14:03:00.123Z"), 1796479380);
  EXPECT_EQ(ParseIso8601("2026-12-05T14:03:00+00:00"), 1796479380);
  EXPECT_EQ(ParseIso8601("2026-12-05T14:03:00+02:00"), -1);  // never guessed
  EXPECT_EQ(ParseIso8601("tomorrow"), -1);
}

TEST(Credentials, FetchedAgainBeforeTheyExpire) {
  AwsCredentials six_hours{"k", "s", "t", 6 * 3600};
  EXPECT_FALSE(DueForRefresh(six_hours, 0, 5 * 3600));
  EXPECT_FALSE(DueForRefresh(six_hours, 0, 6 * 3600 - 301));
  EXPECT_TRUE(DueForRefresh(six_hours, 0, 6 * 3600 - 300));  // five minutes before
  EXPECT_TRUE(DueForRefresh(six_hours, 0, 7 * 3600));
  AwsCredentials short_lived{"k", "s", "t", 1000 + 60};
  EXPECT_FALSE(DueForRefresh(short_lived, 1000, 1029));
  EXPECT_TRUE(DueForRefresh(short_lived, 1000, 1030));                         // half their life
  EXPECT_FALSE(DueForRefresh(AwsCredentials{"k", "s"}, 0, int64_t{1} << 40));  // never expire
}

TEST(Credentials, JsonOfTheEndpointsAndProcesses) {
  auto c = CredentialsFromJson(
      R"({"Code":"Success","AccessKeyId":"AK","SecretAccessKey":"SK","Token":"TK",)"
      R"("Expiration":"2026-12-05T14:03:00Z"})",
      "container");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->access_key, "AK");
  EXPECT_EQ(c->session_token, "TK");
  EXPECT_EQ(c->expires_unix_s, 1796479380);
  c = CredentialsFromJson(R"({"Version":1,"AccessKeyId":"AK","SecretAccessKey":"SK",)"
                          R"("SessionToken":"ST"})",
                          "credential_process");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->session_token, "ST");
  EXPECT_EQ(c->expires_unix_s, 0);
  EXPECT_FALSE(
      CredentialsFromJson(R"({"Version":2,"AccessKeyId":"A","SecretAccessKey":"S"})", "x").ok());
  EXPECT_FALSE(CredentialsFromJson(R"({"AccessKeyId":"A"})", "x").ok());
  EXPECT_FALSE(CredentialsFromJson("<html>", "x").ok());
  EXPECT_FALSE(
      CredentialsFromJson(R"({"AccessKeyId":"A","SecretAccessKey":"S","Expiration":"soon"})", "x")
          .ok());
}

// The chain's order: the environment, a web identity, the profile's keys, its process.
TEST(Credentials, SearchedInTheAwsCliOrder) {
  CleanAwsEnvironment clean;
  const std::string process =
      "[profile p]\ncredential_process = printf "
      "'{\"Version\":1,\"AccessKeyId\":\"PK\",\"SecretAccessKey\":\"PS\","
      "\"Expiration\":\"2030-01-01T00:00:00Z\"}'\n";
  auto c = ResolveCredentials(Profile("", process), "us-east-1");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->access_key, "PK");
  EXPECT_EQ(c->source, "credential_process");
  EXPECT_EQ(c->expires_unix_s, ParseIso8601("2030-01-01T00:00:00Z"));

  c = ResolveCredentials(
      Profile("[p]\naws_access_key_id = FK\naws_secret_access_key = FS\n", process), "us-east-1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key, "FK");  // keys before the process

  ::setenv("AWS_ACCESS_KEY_ID", "EK", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "ES", 1);
  c = ResolveCredentials(Profile("", process), "us-east-1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key, "EK");  // the environment first
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");

  // A configured source that fails is an error naming it, not a fall-through.
  ::setenv("AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent/token", 1);
  ::setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/r", 1);
  c = ResolveCredentials(Profile("", process), "us-east-1");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("token file /nonexistent/token"), std::string::npos)
      << c.status().message();
  ::unsetenv("AWS_WEB_IDENTITY_TOKEN_FILE");
  ::unsetenv("AWS_ROLE_ARN");

  c = ResolveCredentials(Profile("", "[profile p]\ncredential_process = exit 3\n"), "us-east-1");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("credential_process of profile p (exit 3)"),
            std::string::npos)
      << c.status().message();
  // The process's exit code, not the raw wait status (768).
  EXPECT_NE(c.status().message().find("exited with status 3"), std::string::npos)
      << c.status().message();

  c = ResolveCredentials(Profile("", ""), "us-east-1");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("no S3 credentials"), std::string::npos);
}

}  // namespace
}  // namespace dcp::storage::s3
