// AWS Signature Version 4 for S3 requests: pure functions, so that the signer is tested
// against AWS's published examples (sigv4_test.cc) without a server.
//
// Payloads are not hashed: requests carry `x-amz-content-sha256: UNSIGNED-PAYLOAD`, which S3
// accepts over HTTP and HTTPS; data integrity is the format's own block checksums, verified on
// every read.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dcp::storage::s3 {

using Params = std::vector<std::pair<std::string, std::string>>;

struct SigningKey {
  std::string access_key;
  std::string secret_key;
  std::string region;
};

struct RequestToSign {
  std::string method;  // GET, PUT, ...
  std::string path;    // absolute, already URI-encoded ("/bucket/a%20b")
  Params query;        // raw (not encoded)
  Params headers;      // every header sent, `host` included; names any case
  std::string payload_sha256 = "UNSIGNED-PAYLOAD";
};

// RFC 3986 encoding as SigV4 wants it: unreserved characters kept, `/` kept when `keep_slash`.
std::string UriEncode(std::string_view s, bool keep_slash);

// The canonical query string: pairs sorted by encoded name, then value.
std::string CanonicalQuery(const Params& query);

std::string CanonicalRequest(const RequestToSign& r);

// The `Authorization` header value for a request at `amz_date` (yyyymmddThhmmssZ).
std::string Authorization(const RequestToSign& r, const SigningKey& key,
                          const std::string& amz_date);

std::string Sha256Hex(std::string_view data);

}  // namespace dcp::storage::s3
