// The request and reply of one S3 call, shared by the client's transport (s3_client.cc:
// signing, curl, retries) and its calls (s3_calls.cc: the REST operations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "storage/s3/s3_client.h"

namespace dcp::storage::s3 {

struct S3Client::Request {
  std::string method;
  std::string bucket;
  std::string key;
  Params query;
  Params headers;
  std::span<const std::byte> body;
  std::span<std::byte> into;  // a successful response's body goes here (GET ranges)
  bool head = false;
};

// The most of a reply's body the client keeps as text (listings, errors, small objects).
inline constexpr size_t kMaxReplyTextBytes = size_t{64} << 20;

struct S3Client::Response {
  long status = 0;
  std::string text;  // the body, unless it went `into`
  std::string etag;
  std::string date, last_modified;  // the store's clock: now, and when the object was written
  uint64_t content_length = 0;
  uint64_t total_size = 0;  // a ranged reply's object size (Content-Range "bytes a-b/total")
  uint64_t received = 0;
};

// "s3://bucket/key", for messages.
std::string Where(const std::string& bucket, const std::string& key);
// Seconds since the epoch of an HTTP date ("Sun, 06 Nov 1994 08:49:37 GMT"); -1 if unreadable.
int64_t HttpDateSeconds(const std::string& text);

}  // namespace dcp::storage::s3
