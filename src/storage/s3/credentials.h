// Who dcp is to the store: the AWS default credential chain, searched in the AWS CLI's order,
// and when fetched credentials are due to be fetched again.
//
// 1. The environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN.
// 2. A web identity (Kubernetes service accounts, GitHub OIDC): AWS_WEB_IDENTITY_TOKEN_FILE and
//    AWS_ROLE_ARN (AWS_ROLE_SESSION_NAME), or the profile's web_identity_token_file and
//    role_arn, exchanged by STS AssumeRoleWithWebIdentity at AWS_ENDPOINT_URL_STS, else
//    AWS_ENDPOINT_URL, else https://sts.<region>.amazonaws.com.
// 3. The profile's keys (AWS_PROFILE, default "default") in AWS_SHARED_CREDENTIALS_FILE
//    (~/.aws/credentials), then AWS_CONFIG_FILE (~/.aws/config, `[profile NAME]` sections).
// 4. The profile's credential_process: a command printing the credentials as JSON.
// 5. Container credentials (ECS, EKS Pod Identity): AWS_CONTAINER_CREDENTIALS_RELATIVE_URI
//    (from http://169.254.170.2) or AWS_CONTAINER_CREDENTIALS_FULL_URI, with
//    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or AWS_CONTAINER_AUTHORIZATION_TOKEN.
// 6. The EC2 instance's role through the instance metadata service, IMDSv2 (a session token
//    first), at AWS_EC2_METADATA_SERVICE_ENDPOINT (http://169.254.169.254); skipped when
//    AWS_EC2_METADATA_DISABLED=true.
// A source that is configured but fails is an error naming it (never a silent fall-through to
// another identity); an unconfigured one is skipped.
#pragma once

#include <cstdint>
#include <string>

#include "dcp/status.h"

namespace dcp::storage::s3 {

struct AwsCredentials {
  std::string access_key, secret_key, session_token;
  int64_t expires_unix_s = 0;  // 0: they do not expire
  std::string source;          // where they came from, for messages: "environment", ...
  bool SameKeys(const AwsCredentials& o) const {
    return access_key == o.access_key && secret_key == o.secret_key &&
           session_token == o.session_token;
  }
};

// The value of an environment variable; "" when unset.
std::string EnvVar(const char* name);

// The profile AWS_PROFILE names (default "default") in the shared files.
struct AwsProfile {
  std::string name;
  std::string credentials_text;  // AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials
  std::string config_text;       // AWS_CONFIG_FILE or ~/.aws/config
  // The credentials file's value, else the config file's; "" when neither has one.
  std::string Get(const char* key) const;
  static AwsProfile FromEnvironment();
};

// The chain above; kNotFound (naming every source searched) when no source is configured.
Result<AwsCredentials> ResolveCredentials(const AwsProfile& profile, const std::string& region);

// Whether credentials fetched at `fetched_unix_s` should be fetched again at `now_unix_s`:
// within five minutes of expiring, or half their life for shorter-lived ones.
bool DueForRefresh(const AwsCredentials& c, int64_t fetched_unix_s, int64_t now_unix_s);

// Seconds since the epoch of an ISO 8601 UTC time ("2026-12-05T14:03:00Z", fractions and a
// "+00:00" suffix allowed); -1 when unreadable.
int64_t ParseIso8601(const std::string& text);

// Credentials from the JSON the container and instance endpoints and credential_process
// print (AccessKeyId, SecretAccessKey, Token or SessionToken, Expiration).
Result<AwsCredentials> CredentialsFromJson(const std::string& text, const std::string& source);

}  // namespace dcp::storage::s3
