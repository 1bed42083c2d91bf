#include "storage/s3/s3_file_system.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

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

  Status Append(std::span<const std::byte> data) override {
    if (done_) return FailedPrecondition("write to " + path_ + " after it was completed");
    const size_t part = client_.config().part_bytes;
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
  std::vector<std::byte> buffer_;
  std::string upload_id_;
  std::deque<std::string> etags_;
  TaskGroup parts_;
  bool done_ = false;
  Status status_;
};

// Reads by ranged GETs. Announced ranges (WillRead) become extents: neighbours less than
// kGap apart merged up to one part (larger ranges cut into parts). A read inside an extent
// fetches it and the next ones, `connections` at a time in parallel; an extent goes once its
// bytes have all been read, and the oldest go when more than two rounds' worth are held, so
// memory stays bounded whatever order the reads come in. Reads larger than a part go
// straight out, in parallel parts.
class S3ReadableFile final : public ReadableFile {
 public:
  static constexpr uint64_t kGap = uint64_t{1} << 20;

  S3ReadableFile(S3FileSystem& fs, S3Location loc, std::string path, uint64_t size)
      : fs_(fs), loc_(std::move(loc)), path_(std::move(path)), size_(size) {}

  // Adds extents for `ranges`; a range overlapping an extent already announced is skipped
  // (it is read directly, or from that extent).
  void WillRead(std::span<const ByteRange> ranges) override {
    const uint64_t part = fs_.client().config().part_bytes;
    std::vector<ByteRange> sorted;
    for (const ByteRange& r : ranges) {
      if (r.length > 0 && r.offset <= size_ && r.length <= size_ - r.offset) sorted.push_back(r);
    }
    std::sort(sorted.begin(), sorted.end(),
              [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Extent> added;
    for (const ByteRange& r : sorted) {
      const uint64_t end = r.offset + r.length;
      if (Overlaps(r.offset, end) || (!added.empty() && r.offset < added.back().end)) continue;
      if (r.length > part) {
        // A large range: part-sized extents, used when it is read piece by piece (a chunk
        // streamed through a bounce buffer); read whole, it goes straight out instead.
        ++group_;
        for (uint64_t at = r.offset; at < end; at += part) {
          added.push_back({at, std::min(end, at + part), group_});
        }
        ++group_;
        continue;
      }
      if (!added.empty() && added.back().group == group_ && r.offset <= added.back().end + kGap &&
          end - added.back().begin <= part) {
        added.back().end = end;
        continue;
      }
      added.push_back({r.offset, end, group_});
    }
    for (Extent& e : added) extents_.push_back(std::move(e));
    std::sort(extents_.begin(), extents_.end(),
              [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  }

  Status ReadAt(uint64_t offset, std::span<std::byte> dst) override {
    if (offset > size_ || dst.size() > size_ - offset) {
      return DataLoss(path_ + " ends at byte " + std::to_string(size_) + ", before " +
                      std::to_string(offset + dst.size()));
    }
    S3Client& client = fs_.client();
    const uint64_t part = client.config().part_bytes;
    if (dst.size() <= part) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = std::upper_bound(extents_.begin(), extents_.end(), offset,
                                   [](uint64_t o, const Extent& e) { return o < e.begin; });
        if (it != extents_.begin() && std::prev(it)->end >= offset + dst.size()) {
          const size_t i = static_cast<size_t>(std::prev(it) - extents_.begin());
          DCP_RETURN_IF_ERROR(FetchFrom(i));
          Extent& e = extents_[i];
          std::memcpy(dst.data(), e.data->data() + (offset - e.begin), dst.size());
          e.served += dst.size();
          if (e.served >= e.end - e.begin) e.data.reset();  // read in full: not needed again
          return OkStatus();
        }
      }
      return client.GetRange(loc_.bucket, loc_.key, offset, dst);
    }
    // Large reads: parallel ranged GETs of one part each.
    TaskGroup group(fs_.pool(), static_cast<size_t>(client.config().connections));
    for (uint64_t at = 0; at < dst.size(); at += part) {
      std::span<std::byte> piece = dst.subspan(at, std::min<uint64_t>(part, dst.size() - at));
      group.Run([&client, this, offset, at, piece] {
        return client.GetRange(loc_.bucket, loc_.key, offset + at, piece);
      });
    }
    return group.Wait();
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  struct Extent {
    uint64_t begin, end;
    uint32_t group;  // the pieces of one large range share an odd group; small ones even
    std::shared_ptr<std::vector<std::byte>> data = nullptr;  // null until fetched
    uint64_t served = 0;                                     // bytes read from it so far
    uint64_t fetched = 0;                                    // fetch order, for eviction
  };

  bool Overlaps(uint64_t begin, uint64_t end) const {
    auto it = std::upper_bound(extents_.begin(), extents_.end(), begin,
                               [](uint64_t o, const Extent& e) { return o < e.begin; });
    if (it != extents_.begin() && std::prev(it)->end > begin) return true;
    return it != extents_.end() && it->begin < end;
  }
  // Extent k is fetched ahead of a read of extent i: small ones always, pieces of a large
  // range only with a read inside that range (a whole read of it does not use them).
  bool FetchAhead(size_t i, size_t k) const {
    return extents_[k].group % 2 == 0 || extents_[k].group == extents_[i].group;
  }

  // Makes extent i present, with the next ones not yet fetched or read, `connections` of
  // them in parallel; then drops the oldest others beyond two such rounds. Holds mu_.
  Status FetchFrom(size_t i) {
    if (extents_[i].data) return OkStatus();
    S3Client& client = fs_.client();
    const size_t ahead = static_cast<size_t>(client.config().connections);
    TaskGroup group(fs_.pool(), ahead);
    const uint64_t first = fetches_ + 1;  // this round's fetches are numbered from here
    size_t end = i;
    for (size_t k = i; k < extents_.size() && k < i + ahead; ++k, ++end) {
      Extent& e = extents_[k];
      if (e.data || (k > i && (e.served > 0 || !FetchAhead(i, k)))) continue;
      e.data = std::make_shared<std::vector<std::byte>>(e.end - e.begin);
      e.fetched = ++fetches_;
      group.Run(
          [&client, this, &e] { return client.GetRange(loc_.bucket, loc_.key, e.begin, *e.data); });
    }
    Status s = group.Wait();
    if (!s.ok()) {
      for (size_t k = i; k < end; ++k) {
        if (extents_[k].fetched >= first) extents_[k].data.reset();
      }
      return s;
    }
    const uint64_t budget = 2 * ahead * client.config().part_bytes;
    uint64_t held = 0;
    for (const Extent& e : extents_) held += e.data ? e.end - e.begin : 0;
    while (held > budget) {
      Extent* oldest = nullptr;
      for (size_t k = 0; k < extents_.size(); ++k) {
        Extent& e = extents_[k];
        if (e.data && (k < i || k >= end) && (!oldest || e.fetched < oldest->fetched)) oldest = &e;
      }
      if (!oldest) break;
      held -= oldest->end - oldest->begin;
      oldest->data.reset();
    }
    return OkStatus();
  }

  S3FileSystem& fs_;
  S3Location loc_;
  std::string path_;
  uint64_t size_;
  std::mutex mu_;
  std::vector<Extent> extents_;  // ascending, disjoint
  uint32_t group_ = 0;
  uint64_t fetches_ = 0;
};

// A directory's key prefix: "a/b" -> "a/b/", "" (the bucket) -> "".
std::string DirPrefix(const std::string& key) { return key.empty() ? key : key + "/"; }

}  // namespace

S3FileSystem::S3FileSystem(S3Client& client)
    : client_(client), pool_(std::make_unique<TaskPool>(client.config().connections)) {}

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
  return std::unique_ptr<ReadableFile>(new S3ReadableFile(*this, std::move(loc), path, size));
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
  if (*size > (uint64_t{5} << 30)) {
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
  // Prefixes need no creating; the bucket must exist (a clear error now, not at commit).
  DCP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(dir));
  return client_.List(loc.bucket, DirPrefix(loc.key), "/").status();
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
