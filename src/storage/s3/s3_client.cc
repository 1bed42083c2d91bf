#include "storage/s3/s3_client.h"

#include <curl/curl.h>
#include <libxml/parser.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <thread>

#include "storage/s3/s3_request.h"
#include "storage/s3/xml_reply.h"

namespace dcp::storage::s3 {

namespace {

// libcurl's largest receive buffer (CURL_MAX_READ_SIZE) and upload buffer.
constexpr long kCurlReadBufferBytes = 512L << 10;
constexpr long kCurlUploadBufferBytes = 2L << 20;

using Request = S3Client::Request;
using Response = S3Client::Response;

std::string AmzDate() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

Status HttpError(const Request& r, const Response& resp) {
  const std::string what = r.method + " " + Where(r.bucket, r.key);
  std::string code = ErrorCode(resp.text);
  std::string message;
  if (!code.empty()) {
    Xml xml(resp.text);
    message = ChildText(xml.root(), "Message");
  }
  const std::string detail = "HTTP " + std::to_string(resp.status) +
                             (code.empty() ? "" : " " + code) +
                             (message.empty() ? "" : ": " + message);
  if (code == "NoSuchBucket") {
    return NotFound("bucket s3://" + r.bucket + " does not exist (" + detail + ")");
  }
  switch (resp.status) {
    case 404:
      return NotFound(Where(r.bucket, r.key) + " does not exist (" + detail + ")");
    case 412:
      return FailedPrecondition(Where(r.bucket, r.key) + " already exists (" + detail + ")");
    case 416:  // a range past the end: the object is shorter than its reader was told
      return DataLoss(Where(r.bucket, r.key) + " ends before the bytes asked for (" + detail + ")");
    case 409:  // ConditionalRequestConflict: another conditional write raced this one
      return FailedPrecondition(what + ": contended by a concurrent write (" + detail + ")");
    case 401:
    case 403:
      return FailedPrecondition(what + ": access denied, check the S3 credentials (" + detail +
                                ")");
    default:
      if (resp.status >= 500 || resp.status == 429) return Unavailable(what + ": " + detail);
      return InvalidArgument(what + ": " + detail);
  }
}

bool Retryable(const Response& resp) {
  if (resp.status >= 500 || resp.status == 429) return true;
  const std::string code = ErrorCode(resp.text);
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" ||
         code == "ServiceUnavailable" || code == "Throttling";
}

struct Transfer {
  CURL* curl;
  const Request* req;
  Response* resp;
  size_t sent = 0;
  bool overflow = false;
};

size_t OnRead(char* buf, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  size_t left = t->req->body.size() - t->sent;
  size_t k = std::min(left, size * n);
  std::memcpy(buf, t->req->body.data() + t->sent, k);
  t->sent += k;
  return k;
}

size_t OnWrite(char* data, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  const size_t k = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 200 && status < 300 && !t->req->into.empty()) {
    if (t->resp->received + k > t->req->into.size()) {
      t->overflow = true;
      return 0;  // aborts the transfer
    }
    std::memcpy(t->req->into.data() + t->resp->received, data, k);
  } else if (t->resp->text.size() < kMaxReplyTextBytes) {
    t->resp->text.append(data, k);
  }
  t->resp->received += k;
  return k;
}

size_t OnHeader(char* data, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  std::string line(data, size * n);
  size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n')) value.pop_back();
    if (name == "etag") t->resp->etag = value;
    if (name == "date") t->resp->date = value;
    if (name == "last-modified") t->resp->last_modified = value;
    if (name == "content-length")
      t->resp->content_length = std::strtoull(value.c_str(), nullptr, 10);
    if (name == "content-range" && value.find('/') != std::string::npos)
      t->resp->total_size = std::strtoull(value.c_str() + value.find('/') + 1, nullptr, 10);
  }
  return size * n;
}

std::string UrlQuery(const Params& query) {
  std::string out;
  for (const auto& [k, v] : query) {
    out += (out.empty() ? "?" : "&") + UriEncode(k, false);
    if (!v.empty()) out += "=" + UriEncode(v, false);
  }
  return out;
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    xmlInitParser();
  });
}

}  // namespace

S3Client::S3Client(S3Config config)
    : config_(std::move(config)),
      credentials_(config_.credentials),
      fetched_unix_s_(std::time(nullptr)) {
  InitCurlOnce();
}

AwsCredentials S3Client::CurrentCredentials() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = std::time(nullptr);
    if (!DueForRefresh(credentials_, fetched_unix_s_, now) || now == tried_unix_s_) {
      return credentials_;
    }
  }
  std::unique_lock<std::mutex> refreshing(refresh_mu_, std::try_to_lock);
  if (refreshing.owns_lock()) (void)RefreshCredentials();
  std::lock_guard<std::mutex> lock(mu_);
  return credentials_;
}

bool S3Client::RefreshCredentials() {
  auto fresh = ResolveCredentials(AwsProfile::FromEnvironment(), config_.region);
  std::lock_guard<std::mutex> lock(mu_);
  tried_unix_s_ = std::time(nullptr);
  if (!fresh.ok()) {
    std::fprintf(stderr, "dcp: could not refresh the S3 credentials (%s): %s\n",
                 credentials_.source.c_str(), fresh.status().message().c_str());
    return false;
  }
  fetched_unix_s_ = tried_unix_s_;
  const bool changed = !fresh->SameKeys(credentials_);
  credentials_ = std::move(*fresh);
  return changed;
}

S3Client::~S3Client() {
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

RequestCounts S3Client::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

void* S3Client::Borrow() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.requests;
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void S3Client::Return(void* curl) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(curl);
}

Status S3Client::Attempt(void* handle, const Request& r, Response& resp, bool* retry) {
  CURL* curl = static_cast<CURL*>(handle);
  curl_easy_reset(curl);
  resp = Response{};
  *retry = false;

  // The URL and the Host header the signature covers.
  std::string host_and_scheme = config_.endpoint;
  if (host_and_scheme.empty()) host_and_scheme = "https://s3." + config_.region + ".amazonaws.com";
  const size_t scheme_end = host_and_scheme.find("://");
  const std::string scheme = host_and_scheme.substr(0, scheme_end);
  std::string host = host_and_scheme.substr(scheme_end + 3);
  std::string path;
  if (config_.path_style) {
    path = "/" + r.bucket + (r.key.empty() ? "/" : "/" + UriEncode(r.key, true));
  } else {
    host = r.bucket + "." + host;
    path = "/" + UriEncode(r.key, true);
  }
  const std::string url = scheme + "://" + host + path + UrlQuery(r.query);

  RequestToSign sig;
  sig.method = r.method;
  sig.path = path;
  sig.query = r.query;
  sig.headers = r.headers;
  const std::string amz_date = AmzDate();
  sig.headers.emplace_back("host", host);
  sig.headers.emplace_back("x-amz-date", amz_date);
  sig.headers.emplace_back("x-amz-content-sha256", "UNSIGNED-PAYLOAD");
  const AwsCredentials creds = CurrentCredentials();
  if (!creds.session_token.empty()) {
    sig.headers.emplace_back("x-amz-security-token", creds.session_token);
  }
  const std::string auth =
      Authorization(sig, {creds.access_key, creds.secret_key, config_.region}, amz_date);

  curl_slist* headers = nullptr;
  for (const auto& [k, v] : sig.headers) {
    if (k != "host") headers = curl_slist_append(headers, (k + ": " + v).c_str());
  }
  headers = curl_slist_append(headers, ("Authorization: " + auth).c_str());
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip

  Transfer t{curl, &r, &resp};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
  // A stalled connection (under 1 KiB/s for 60 s) is a failed attempt, not a hang.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
  // Large socket reads and writes: with curl's 16 KiB / 64 KiB defaults a part costs ~1,000
  // recv (or send) calls, each with a poll, and the system calls cost more CPU than the bytes.
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, kCurlReadBufferBytes);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, kCurlUploadBufferBytes);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnWrite);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  if (r.head) {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT" || r.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, OnRead);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    if (r.method == "POST") curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (r.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);

  const std::string what = r.method + " " + Where(r.bucket, r.key);
  if (t.overflow) return DataLoss(what + ": the response is longer than requested");
  if (rc != CURLE_OK) {
    *retry = true;
    std::string target = config_.endpoint.empty() ? host : config_.endpoint;
    return Unavailable(what + ": cannot reach the S3 endpoint " + target + ": " +
                       curl_easy_strerror(rc));
  }
  if (resp.status >= 200 && resp.status < 300) {
    // CompleteMultipartUpload and CopyObject can fail after a 200 status (a GET's body is
    // the object's own bytes, which may hold any text).
    if (r.method != "GET" && resp.text.find("<Error>") != std::string::npos) {
      *retry = Retryable(resp);
      return HttpError(r, resp);
    }
    return OkStatus();
  }
  *retry = Retryable(resp);
  return HttpError(r, resp);
}

Result<Response> S3Client::Send(const Request& r) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  Status last;
  bool refreshed = false;
  for (int attempt = 0; attempt < config_.max_attempts; ++attempt) {
    if (attempt > 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++counts_.retries;
      }
      // 50 ms doubling to 5 s, with jitter so that ranks do not retry in step.
      double base = std::min(5.0, 0.05 * static_cast<double>(uint64_t{1} << std::min(attempt, 10)));
      double jitter = std::uniform_real_distribution<double>(0.5, 1.0)(rng);
      std::this_thread::sleep_for(std::chrono::duration<double>(base * jitter));
    }
    void* curl = Borrow();
    Response resp;
    bool retry = false;
    last = Attempt(curl, r, resp, &retry);
    if (last.ok()) {
      Return(curl);
      return resp;
    }
    if (retry) {
      curl_easy_cleanup(static_cast<CURL*>(curl));  // its connection may be broken
      continue;
    }
    Return(curl);
    // Session credentials run out on multi-day jobs: once per request, the chain is resolved
    // again (what a refresher wrote since, a new token from STS or a metadata endpoint) and
    // the request signed again with what it gives.
    const std::string code = ErrorCode(resp.text);
    if ((code == "ExpiredToken" || code == "TokenRefreshRequired") && !refreshed) {
      refreshed = true;
      if (RefreshCredentials()) {
        --attempt;  // not a failure of the store's
        continue;
      }
    }
    return last;
  }
  return last.Annotate("after " + std::to_string(config_.max_attempts) + " attempts: ");
}

std::string Where(const std::string& bucket, const std::string& key) {
  return "s3://" + bucket + (key.empty() ? "" : "/" + key);
}

int64_t HttpDateSeconds(const std::string& text) {
  std::tm tm{};
  const char* end = strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S", &tm);
  return end ? static_cast<int64_t>(timegm(&tm)) : -1;
}

}  // namespace dcp::storage::s3
