// The S3 REST operations dcp uses, each one request (or a paginated series) through
// S3Client::Send (s3_client.cc), which signs, sends and retries it.
#include <memory>
#include <mutex>

#include "storage/s3/s3_client.h"
#include "storage/s3/s3_request.h"
#include "storage/s3/xml_reply.h"

namespace dcp::storage::s3 {

using Request = S3Client::Request;
using Response = S3Client::Response;

Status S3Client::PutObject(const std::string& bucket, const std::string& key,
                           std::span<const std::byte> body, bool if_none_match) {
  Request r{"PUT", bucket, key};
  r.body = body;
  if (if_none_match) r.headers.emplace_back("if-none-match", "*");
  return Send(r).status();
}

Result<uint64_t> S3Client::HeadObject(const std::string& bucket, const std::string& key) {
  Request r{"HEAD", bucket, key};
  r.head = true;
  DCP_ASSIGN_OR_RETURN(Response resp, Send(r));
  return resp.content_length;
}

Status S3Client::GetRange(const std::string& bucket, const std::string& key, uint64_t offset,
                          std::span<std::byte> dst) {
  if (dst.empty()) return OkStatus();
  Request r{"GET", bucket, key};
  r.headers.emplace_back(
      "range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + dst.size() - 1));
  r.into = dst;
  DCP_ASSIGN_OR_RETURN(Response resp, Send(r));
  if (resp.received != dst.size()) {
    return DataLoss(Where(bucket, key) + " ends before byte " +
                    std::to_string(offset + dst.size()) + " (read " +
                    std::to_string(resp.received) + " of " + std::to_string(dst.size()) +
                    " bytes at offset " + std::to_string(offset) + ")");
  }
  return OkStatus();
}

Result<std::pair<std::string, uint64_t>> S3Client::GetFirstBytes(const std::string& bucket,
                                                                 const std::string& key,
                                                                 size_t max_bytes) {
  Request r{"GET", bucket, key};
  r.headers.emplace_back("range", "bytes=0-" + std::to_string(max_bytes - 1));
  DCP_ASSIGN_OR_RETURN(Response resp, Send(r));
  // All of it kept (the client keeps at most 64 MiB of a reply's text); 206 names the whole
  // size, and a store that ignores the range sends the whole object (200).
  const bool whole = resp.status != 206;
  if (resp.received != resp.text.size() || (!whole && resp.received > max_bytes) ||
      (!whole && resp.total_size < resp.received)) {
    return DataLoss(Where(bucket, key) + ": " + std::to_string(resp.received) +
                    " bytes received for the first " + std::to_string(max_bytes) +
                    (whole ? "" : " of " + std::to_string(resp.total_size)));
  }
  return std::make_pair(std::move(resp.text), whole ? resp.received : resp.total_size);
}

Result<SmallObject> S3Client::GetSmallObject(const std::string& bucket, const std::string& key,
                                             size_t max_bytes) {
  DCP_ASSIGN_OR_RETURN(Response resp, Send(Request{"GET", bucket, key}));
  if (resp.received > max_bytes || resp.received != resp.text.size()) {
    return DataLoss(Where(bucket, key) + ": " + std::to_string(resp.received) +
                    " bytes, more than the " + std::to_string(max_bytes) + " expected");
  }
  SmallObject out{std::move(resp.text), resp.etag, -1};
  const int64_t now = HttpDateSeconds(resp.date), written = HttpDateSeconds(resp.last_modified);
  if (now >= 0 && written >= 0)
    out.age_seconds = static_cast<double>(std::max<int64_t>(0, now - written));
  return out;
}

Result<std::string> S3Client::PutObjectIf(const std::string& bucket, const std::string& key,
                                          std::span<const std::byte> body,
                                          const std::string& if_match) {
  Request r{"PUT", bucket, key};
  r.body = body;
  if (if_match.empty()) {
    r.headers.emplace_back("if-none-match", "*");
  } else {
    r.headers.emplace_back("if-match", if_match);
  }
  DCP_ASSIGN_OR_RETURN(Response resp, Send(r));
  return resp.etag;
}

Status S3Client::DeleteObjectIf(const std::string& bucket, const std::string& key,
                                const std::string& if_match) {
  Request r{"DELETE", bucket, key};
  r.headers.emplace_back("if-match", if_match);
  return Send(r).status();
}

Status S3Client::DeleteObject(const std::string& bucket, const std::string& key) {
  return Send(Request{"DELETE", bucket, key}).status();  // a missing key is a success (204)
}

Status S3Client::CopyObject(const std::string& bucket, const std::string& from,
                            const std::string& to) {
  Request r{"PUT", bucket, to};
  r.headers.emplace_back("x-amz-copy-source", "/" + bucket + "/" + UriEncode(from, true));
  return Send(r).status().Annotate("copy " + Where(bucket, from) + ": ");
}

Result<Listing> S3Client::List(const std::string& bucket, const std::string& prefix,
                               const std::string& delimiter) {
  Listing out;
  std::string token;
  while (true) {
    Request r{"GET", bucket, ""};
    r.query = {{"list-type", "2"}, {"prefix", prefix}};
    if (!delimiter.empty()) r.query.emplace_back("delimiter", delimiter);
    if (!token.empty()) r.query.emplace_back("continuation-token", token);
    DCP_ASSIGN_OR_RETURN(Response resp, Send(r));
    Xml xml(resp.text);
    if (!xml.root()) return Unavailable("listing " + Where(bucket, prefix) + ": unreadable reply");
    ForEachTop(xml, "Contents", [&](const xmlNode* n) {
      out.objects.push_back(
          {ChildText(n, "Key"), std::strtoull(ChildText(n, "Size").c_str(), nullptr, 10)});
    });
    ForEachTop(xml, "CommonPrefixes",
               [&](const xmlNode* n) { out.prefixes.push_back(ChildText(n, "Prefix")); });
    if (ChildText(xml.root(), "IsTruncated") != "true") break;
    token = ChildText(xml.root(), "NextContinuationToken");
    if (token.empty()) break;
  }
  return out;
}

Result<std::string> S3Client::CreateMultipartUpload(const std::string& bucket,
                                                    const std::string& key) {
  Request r{"POST", bucket, key};
  r.query = {{"uploads", ""}};
  DCP_ASSIGN_OR_RETURN(Response resp, Send(r));
  Xml xml(resp.text);
  std::string id = Text(Find(xml.root(), "UploadId"));
  if (id.empty())
    return Unavailable("start upload of " + Where(bucket, key) + ": no UploadId in the reply");
  return id;
}

Result<std::string> S3Client::UploadPart(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, int part_number,
                                         std::span<const std::byte> body) {
  Request r{"PUT", bucket, key};
  r.query = {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}};
  r.body = body;
  DCP_ASSIGN_OR_RETURN(Response resp, Send(r));
  if (resp.etag.empty()) return Unavailable("upload part of " + Where(bucket, key) + ": no ETag");
  return resp.etag;
}

Status S3Client::CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id,
                                         const std::vector<std::string>& etags,
                                         bool if_none_match) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags[i] +
           "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  Request r{"POST", bucket, key};
  r.query = {{"uploadId", upload_id}};
  r.body = std::as_bytes(std::span(xml.data(), xml.size()));
  r.headers.emplace_back("content-type", "application/xml");
  if (if_none_match) r.headers.emplace_back("if-none-match", "*");
  return Send(r).status();
}

Status S3Client::AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id) {
  Request r{"DELETE", bucket, key};
  r.query = {{"uploadId", upload_id}};
  Status s = Send(r).status();
  return s.code() == StatusCode::kNotFound ? OkStatus() : s;
}

Result<std::vector<UploadInfo>> S3Client::ListMultipartUploads(const std::string& bucket,
                                                               const std::string& prefix) {
  std::vector<UploadInfo> out;
  std::string key_marker, id_marker;
  while (true) {
    Request r{"GET", bucket, ""};
    r.query = {{"uploads", ""}, {"prefix", prefix}};
    if (!key_marker.empty()) r.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) r.query.emplace_back("upload-id-marker", id_marker);
    DCP_ASSIGN_OR_RETURN(Response resp, Send(r));
    Xml xml(resp.text);
    if (!xml.root())
      return Unavailable("listing uploads of " + Where(bucket, prefix) + ": unreadable reply");
    ForEachTop(xml, "Upload", [&](const xmlNode* n) {
      out.push_back({ChildText(n, "Key"), ChildText(n, "UploadId")});
    });
    if (ChildText(xml.root(), "IsTruncated") != "true") break;
    key_marker = ChildText(xml.root(), "NextKeyMarker");
    id_marker = ChildText(xml.root(), "NextUploadIdMarker");
    if (key_marker.empty() && id_marker.empty()) break;
  }
  return out;
}

namespace {
std::mutex g_default_mu;
std::unique_ptr<S3Client> g_default_client;  // built by the first s3:// path
}  // namespace

Result<S3Client*> DefaultS3Client() {
  std::lock_guard<std::mutex> lock(g_default_mu);
  if (!g_default_client) {
    DCP_ASSIGN_OR_RETURN(S3Config c, S3ConfigFromEnvironment());
    g_default_client = std::make_unique<S3Client>(std::move(c));
  }
  return g_default_client.get();
}

uint64_t DefaultS3ClientRequests() {
  std::lock_guard<std::mutex> lock(g_default_mu);
  return g_default_client ? g_default_client->counts().requests : 0;
}

}  // namespace dcp::storage::s3
