// The S3 REST calls dcp needs, over libcurl, signed with SigV4 (sigv4.h).
//
// Thread-safe: each call borrows a curl handle from a pool (kept, with its open connection,
// for the next call). Every call is retried with exponential backoff and jitter on what may
// pass: connection failures and resets, HTTP 5xx, 429 and S3's throttling codes (SlowDown,
// RequestTimeout). Errors name the object (s3://bucket/key) and S3's own error code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dcp/status.h"
#include "storage/s3/s3_config.h"
#include "storage/s3/sigv4.h"

namespace dcp::storage::s3 {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

struct Listing {
  std::vector<ObjectInfo> objects;    // keys under the prefix (not past the delimiter)
  std::vector<std::string> prefixes;  // "sub/" groups, when a delimiter is given
};

struct UploadInfo {
  std::string key;
  std::string upload_id;
};

// A small object (a lock) as read: its text, its ETag, and how long ago it was written by the
// store's clock (Date minus Last-Modified of one reply; -1 when the store does not say).
struct SmallObject {
  std::string text;
  std::string etag;
  double age_seconds = -1;
};

// What one client has sent, for `dcp bench` (requests per GiB) and the tests.
struct RequestCounts {
  uint64_t requests = 0;
  uint64_t retries = 0;
};

class S3Client {
 public:
  explicit S3Client(S3Config config);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Config& config() const { return config_; }
  RequestCounts counts() const;

  // `if_none_match`: fail with kFailedPrecondition when the key exists (conditional write).
  Status PutObject(const std::string& bucket, const std::string& key,
                   std::span<const std::byte> body, bool if_none_match = false);
  // kNotFound when missing; kDataLoss when longer than `max_bytes`.
  Result<SmallObject> GetSmallObject(const std::string& bucket, const std::string& key,
                                     size_t max_bytes);
  // The object's first `max_bytes` bytes (all of it when shorter, or when the store ignores
  // the range) and its whole size, by one ranged GET. kNotFound when missing; kDataLoss when it
  // is empty (HTTP 416) or the reply does not say its size.
  Result<std::pair<std::string, uint64_t>> GetFirstBytes(const std::string& bucket,
                                                         const std::string& key, size_t max_bytes);
  // Compare-and-swap: writes only while the object's ETag is `if_match` ("": only if absent);
  // kFailedPrecondition (412) when it is not. Returns the new ETag.
  Result<std::string> PutObjectIf(const std::string& bucket, const std::string& key,
                                  std::span<const std::byte> body, const std::string& if_match);
  // Deletes only while the object's ETag is `if_match`.
  Status DeleteObjectIf(const std::string& bucket, const std::string& key,
                        const std::string& if_match);
  // kNotFound when missing.
  Result<uint64_t> HeadObject(const std::string& bucket, const std::string& key);
  // Exactly dst.size() bytes at `offset`.
  Status GetRange(const std::string& bucket, const std::string& key, uint64_t offset,
                  std::span<std::byte> dst);
  Status DeleteObject(const std::string& bucket, const std::string& key);
  Status CopyObject(const std::string& bucket, const std::string& from, const std::string& to);
  Result<Listing> List(const std::string& bucket, const std::string& prefix,
                       const std::string& delimiter);

  Result<std::string> CreateMultipartUpload(const std::string& bucket, const std::string& key);
  // The part's ETag.
  Result<std::string> UploadPart(const std::string& bucket, const std::string& key,
                                 const std::string& upload_id, int part_number,
                                 std::span<const std::byte> body);
  Status CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                 const std::string& upload_id,
                                 const std::vector<std::string>& etags, bool if_none_match);
  Status AbortMultipartUpload(const std::string& bucket, const std::string& key,
                              const std::string& upload_id);
  Result<std::vector<UploadInfo>> ListMultipartUploads(const std::string& bucket,
                                                       const std::string& prefix);

  struct Request;
  struct Response;

 private:
  Result<Response> Send(const Request& r);
  Status Attempt(void* curl, const Request& r, Response& out, bool* retry);
  void* Borrow();
  void Return(void* curl);
  // The credentials to sign with now: fetched again by the default chain when they are due to
  // expire (credentials.h), by one thread while the others go on with the current ones.
  AwsCredentials CurrentCredentials();
  // Resolves the chain again (after an expired-token answer, or when due): true when the keys
  // changed. A failure keeps the current ones and says so on stderr.
  bool RefreshCredentials();

  S3Config config_;
  AwsCredentials credentials_;  // guarded by mu_, as the two times below
  int64_t fetched_unix_s_ = 0;
  int64_t tried_unix_s_ = 0;  // the last refresh attempt: at most one a second
  std::mutex refresh_mu_;
  mutable std::mutex mu_;
  std::vector<void*> idle_;  // CURL* handles
  RequestCounts counts_;
};

// One client per configuration for the process (the environment's, for s3:// paths).
Result<S3Client*> DefaultS3Client();
// Requests the default client sent; 0 where no s3:// path built it (nothing is looked up).
uint64_t DefaultS3ClientRequests();

}  // namespace dcp::storage::s3
