// Where an S3-compatible store is and who we are to it, resolved the way the AWS tools do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dcp/status.h"
#include "storage/s3/credentials.h"

namespace dcp::storage::s3 {

struct S3Config {
  // "http(s)://host[:port]"; empty: AWS itself (https://s3.<region>.amazonaws.com).
  std::string endpoint;
  std::string region = "us-east-1";
  AwsCredentials credentials;  // resolved by the default chain (credentials.h)
  // Path-style URLs (endpoint/bucket/key): the default with a custom endpoint, which is how
  // MinIO, Ceph RGW and test servers are addressed; virtual-hosted (bucket.host/key) on AWS.
  bool path_style = true;
  // Multipart part size and the parallel requests of one rank (uploads and ranged reads).
  uint64_t part_bytes = uint64_t{16} << 20;
  int connections = 8;
  int max_attempts = 8;  // per request, with exponential backoff on 5xx, throttling, resets
};

// From the environment and the shared files, as the AWS CLI resolves them:
// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else the profile's `endpoint_url`; AWS_REGION or
// AWS_DEFAULT_REGION, else the profile's `region`; credentials by the default chain
// (credentials.h; kInvalidArgument when none is configured).
// dcp's own knobs: DCP_S3_PART_MB, DCP_S3_CONNECTIONS, DCP_S3_MAX_ATTEMPTS,
// DCP_S3_ADDRESSING (path | virtual).
Result<S3Config> S3ConfigFromEnvironment();

// The value of `key` in section `section` of an INI-style AWS file's text; "" when absent.
std::string IniValue(const std::string& text, const std::string& section, const std::string& key);

// "s3://bucket/some/prefix" -> bucket, key ("some/prefix"); kInvalidArgument otherwise.
struct S3Location {
  std::string bucket;
  std::string key;
};
bool IsS3Path(const std::string& path);
Result<S3Location> ParseS3Path(const std::string& path);

// S3 takes at most 10,000 parts per upload, each 5 MiB to 5 GiB (the last may be smaller).
inline constexpr int kMaxParts = 10000;
inline constexpr uint64_t kMaxPartBytes = uint64_t{5} << 30;
// CopyObject copies at most 5 GiB in one request.
inline constexpr uint64_t kMaxCopyBytes = uint64_t{5} << 30;
// The size of part `index` (0-based) of an upload whose first parts are `base` bytes: doubled
// every 1,000 parts, up to 5 GiB, so that an upload of unknown size stays under kMaxParts up to
// 1000 * base * 1023 bytes (16 TiB at the default 16 MiB) -- S3's own 5 TiB object limit first.
uint64_t PartBytes(uint64_t base, size_t index);
// The part size for a transfer of `total` bytes known ahead (an upload told its size, one
// large ranged read): one part per connection, at least `part_bytes` and at most four times
// that, so that a large transfer costs fewer requests per GiB (16 at the default 16 MiB) while
// a smaller one still spreads over every connection.
uint64_t PartBytesFor(const S3Config& config, uint64_t total);

}  // namespace dcp::storage::s3
