#include "storage/s3/s3_file_system.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "storage/s3/s3_readable_file.h"
#include "storage/s3/s3_request.h"
#include "storage/s3/task_pool.h"

namespace dcp::storage::s3 {
namespace {

// A multipart upload fed by Append: full parts go out on the pool while the caller goes on
// (at most `connections` in flight, each holding its own buffer); Sync() sends the rest and
// completes the upload, which is when the object appears, whole.
class S3WritableFile final : public WritableFile {
 public:
  S3WritableFile(S3FileSystem& fs, S3Location loc, std::string path, bool exclusive)
      : client_(fs.client()),
        loc_(std::move(loc)),
        path_(std::move(path)),
        exclusive_(exclusive),
        parts_(fs.pool(), static_cast<size_t>(client_.config().connections)) {}

  ~S3WritableFile() override {
    (void)parts_.Wait();
    if (!done_ && !upload_id_.empty()) {
      (void)client_.AbortMultipartUpload(loc_.bucket, loc_.key, upload_id_);
    }
  }

  // Sized before the first part: parts as large as the file allows (PartBytesFor).
  void WillWrite(uint64_t total_bytes) override {
    if (etags_.empty() && buffer_.empty()) {
      part_base_ = PartBytesFor(client_.config(), total_bytes);
    }
  }

  Status Append(std::span<const std::byte> data) override {
    if (done_) return FailedPrecondition("write to " + path_ + " after it was completed");
    // Parts grow as the upload does (PartBytes): a file of any size S3 takes fits its
    // 10,000 parts.
    const size_t part = PartBytes(part_base_, etags_.size());
    while (!data.empty()) {
      if (buffer_.capacity() < part) buffer_.reserve(part);
      size_t k = std::min(part - buffer_.size(), data.size());
      buffer_.insert(buffer_.end(), data.begin(), data.begin() + static_cast<ptrdiff_t>(k));
      data = data.subspan(k);
      if (buffer_.size() == part) DCP_RETURN_IF_ERROR(SendPart());
    }
    return OkStatus();
  }

  Status Sync() override {
    if (done_) return status_;
    done_ = true;
    status_ = Finish();
    if (!status_.ok() && !upload_id_.empty()) {
      (void)client_.AbortMultipartUpload(loc_.bucket, loc_.key, upload_id_);
    }
    return status_;
  }

  Status Close() override { return Sync(); }
  const std::string& path() const override { return path_; }

 private:
  Status SendPart() {
    DCP_RETURN_IF_ERROR(parts_.first_error());
    if (upload_id_.empty()) {
      DCP_ASSIGN_OR_RETURN(upload_id_, client_.CreateMultipartUpload(loc_.bucket, loc_.key));
    }
    const int number = static_cast<int>(etags_.size()) + 1;
    if (number > kMaxParts) {
      return FailedPrecondition(path_ + ": larger than an S3 object may be (" +
                                std::to_string(kMaxParts) + " parts)");
    }
    etags_.emplace_back();
    auto body = std::make_shared<std::vector<std::byte>>(std::move(buffer_));
    buffer_ = {};
    std::string* etag = &etags_.back();
    // etags_ is a deque: the slot stays put while later parts are added.
    parts_.Run([this, body, number, etag]() -> Status {
      auto tag = client_.UploadPart(loc_.bucket, loc_.key, upload_id_, number, *body);
      if (!tag.ok()) return tag.status();
      *etag = *tag;
      return OkStatus();
    });
    return OkStatus();
  }

  Status Finish() {
    if (upload_id_.empty()) {
      // Small enough for one request.
      return client_.PutObject(loc_.bucket, loc_.key, buffer_, exclusive_);
    }
    if (!buffer_.empty()) DCP_RETURN_IF_ERROR(SendPart());
    DCP_RETURN_IF_ERROR(parts_.Wait());
    std::vector<std::string> tags(etags_.begin(), etags_.end());
    return client_.CompleteMultipartUpload(loc_.bucket, loc_.key, upload_id_, tags, exclusive_);
  }

  S3Client& client_;
  S3Location loc_;
  std::string path_;
  bool exclusive_;
  uint64_t part_base_ = client_.config().part_bytes;
  std::vector<std::byte> buffer_;
  std::string upload_id_;
  std::deque<std::string> etags_;
  TaskGroup parts_;
  bool done_ = false;
  Status status_;
};

// A directory's key prefix: "a/b" -> "a/b/", "" (the bucket) -> "".
std::string DirPrefix(const std::string& key) { return key.empty() ? key : key + "/"; }

}  // namespace

S3FileSystem::S3FileSystem(S3Client& client)
    : client_(client),
      // One window of parts kept: what a read's window frees as it slides on.
      fetch_buffers_(static_cast<uint64_t>(client.config().connections) *
                     client.config().part_bytes),
      pool_(std::make_unique<TaskPool>(client.config().connections)) {}

S3FileSystem::~S3FileSystem() = default;

Result<std::unique_ptr<WritableFile>> S3FileSystem::NewWritableFile(const std::string& path) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  return std::unique_ptr<WritableFile>(new S3WritableFile(*this, std::move(loc), path, false));
}

Result<std::unique_ptr<WritableFile>> S3FileSystem::NewExclusiveFile(const std::string& path) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  // A quick answer when it exists already; the conditional write at Sync() settles races.
  auto size = client_.HeadObject(loc.bucket, loc.key);
  if (size.ok()) return FailedPrecondition(path + " already exists");
  if (size.status().code() != StatusCode::kNotFound) return size.status();
  return std::unique_ptr<WritableFile>(new S3WritableFile(*this, std::move(loc), path, true));
}

Result<std::unique_ptr<WritableFile>> S3FileSystem::ReuseFile(const std::string& old_path,
                                                              const std::string& /*path*/) {
  // Nothing to reuse: objects are written whole.
  return NotFound(old_path + ": object stores do not recycle files");
}

Result<std::unique_ptr<ReadableFile>> S3FileSystem::OpenReadable(const std::string& path) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  DCP_ASSIGN_OR_RETURN(uint64_t size, client_.HeadObject(loc.bucket, loc.key));
  return OpenReadableSized(path, size);
}

Result<std::unique_ptr<ReadableFile>> S3FileSystem::OpenReadableSized(const std::string& path,
                                                                      uint64_t size) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  return std::unique_ptr<ReadableFile>(new S3ReadableFile(*this, std::move(loc), path, size));
}

Result<std::string> S3FileSystem::ReadWhole(const std::string& path) {
  // One GET for a file of up to one part (a checkpoint's metadata mostly); a larger one then
  // has its rest read by ranged GETs (in parallel past a part). Not one unbounded GET: the
  // client keeps at most 64 MiB of a reply's text.
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  auto first = client_.GetFirstBytes(
      loc.bucket, loc.key, std::min<uint64_t>(client_.config().part_bytes, kMaxReplyTextBytes));
  if (!first.ok() && first.status().code() == StatusCode::kDataLoss) {
    // An empty object (416), or a reply not kept whole or without its size: HEAD + ranged GETs.
    return FileSystem::ReadWhole(path);
  }
  DCP_RETURN_IF_ERROR(first.status());
  auto& [text, total] = *first;
  if (total > text.size()) {
    const size_t have = text.size();
    text.resize(total);
    DCP_ASSIGN_OR_RETURN(auto file, OpenReadableSized(path, total));
    DCP_RETURN_IF_ERROR(file->ReadAt(
        have, std::as_writable_bytes(std::span(text.data() + have, text.size() - have))));
  }
  return std::move(text);
}

Status S3FileSystem::Rename(const std::string& from, const std::string& to) {
  DCP_ASSIGN_OR_RETURN(S3Location a, ParseS3Path(from));
  DCP_ASSIGN_OR_RETURN(S3Location b, ParseS3Path(to));
  if (a.bucket != b.bucket)
    return InvalidArgument("rename " + from + " to " + to + ": across buckets");
  auto size = client_.HeadObject(a.bucket, a.key);
  if (!size.ok()) {
    if (size.status().code() == StatusCode::kNotFound) {
      auto under = client_.List(a.bucket, DirPrefix(a.key), "/");
      if (under.ok() && (!under->objects.empty() || !under->prefixes.empty())) {
        return FailedPrecondition("rename " + from +
                                  ": directories cannot be renamed on "
                                  "object storage");
      }
    }
    return size.status();
  }
  if (*size > kMaxCopyBytes) {
    return FailedPrecondition("rename " + from + ": objects over 5 GiB are not renamed");
  }
  DCP_RETURN_IF_ERROR(client_.CopyObject(a.bucket, a.key, b.key));
  return client_.DeleteObject(a.bucket, a.key);
}

Status S3FileSystem::Remove(const std::string& path) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  if (loc.key.empty()) return OkStatus();  // the bucket itself: nothing to remove
  return client_.DeleteObject(loc.bucket, loc.key);
}

Status S3FileSystem::CreateDirs(const std::string& dir) {
  // Prefixes need no creating. A missing bucket fails the first request into it, naming the
  // bucket (a save's is its lock, before anything is written): no request of its own here.
  return ParseS3Path(dir).status();
}

Result<std::vector<std::string>> S3FileSystem::List(const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(dir));
  const std::string prefix = DirPrefix(loc.key);
  DCP_ASSIGN_OR_RETURN(Listing listing, client_.List(loc.bucket, prefix, "/"));
  std::vector<std::string> names;
  for (const auto& o : listing.objects) {
    if (o.key.size() > prefix.size()) names.push_back(o.key.substr(prefix.size()));
  }
  for (const auto& p : listing.prefixes) {
    std::string name = p.substr(prefix.size());
    if (!name.empty() && name.back() == '/') name.pop_back();
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

Result<uint64_t> S3FileSystem::FileSize(const std::string& path) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  return client_.HeadObject(loc.bucket, loc.key);
}

Status S3FileSystem::WriteAtomic(const std::string& path, std::string_view data,
                                 const std::string& /*tmp_suffix*/) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  return client_.PutObject(loc.bucket, loc.key, std::as_bytes(std::span(data.data(), data.size())));
}

Result<FileSystem::Versioned> S3FileSystem::ReadVersioned(const std::string& path,
                                                          size_t max_bytes) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  DCP_ASSIGN_OR_RETURN(SmallObject o, client_.GetSmallObject(loc.bucket, loc.key, max_bytes));
  return Versioned{std::move(o.text), std::move(o.etag), o.age_seconds};
}

Result<std::string> S3FileSystem::WriteIfVersion(const std::string& path, std::string_view data,
                                                 const std::string& version) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  return client_.PutObjectIf(loc.bucket, loc.key,
                             std::as_bytes(std::span(data.data(), data.size())), version);
}

Status S3FileSystem::RemoveIfVersion(const std::string& path, const std::string& version) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
  Status s = client_.DeleteObjectIf(loc.bucket, loc.key, version);
  if (s.ok() || s.code() == StatusCode::kNotFound) return OkStatus();
  if (s.code() == StatusCode::kFailedPrecondition) return s;
  // A store that takes no condition on DELETE: compare, then delete (a short race, as before).
  auto now = client_.GetSmallObject(loc.bucket, loc.key, size_t{1} << 20);
  if (!now.ok()) return now.status().code() == StatusCode::kNotFound ? OkStatus() : now.status();
  if (now->etag != version) return FailedPrecondition(path + " changed meanwhile");
  return client_.DeleteObject(loc.bucket, loc.key);
}

Status S3FileSystem::DropUnfinishedWrites(const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(dir));
  const std::string prefix = DirPrefix(loc.key);
  DCP_ASSIGN_OR_RETURN(auto uploads, client_.ListMultipartUploads(loc.bucket, prefix));
  for (const auto& u : uploads) {
    // Only this directory's own files, not those of directories below it.
    if (u.key.find('/', prefix.size()) != std::string::npos) continue;
    DCP_RETURN_IF_ERROR(client_.AbortMultipartUpload(loc.bucket, u.key, u.upload_id));
  }
  return OkStatus();
}

Result<FileSystem*> DefaultS3FileSystem() {
  static std::mutex mu;
  static std::unique_ptr<S3FileSystem> fs;
  std::lock_guard<std::mutex> lock(mu);
  if (!fs) {
    DCP_ASSIGN_OR_RETURN(S3Client * client, DefaultS3Client());
    fs = std::make_unique<S3FileSystem>(*client);
  }
  return fs.get();
}

}  // namespace dcp::storage::s3
