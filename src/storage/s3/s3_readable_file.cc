#include "storage/s3/s3_readable_file.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>

#include "storage/s3/s3_file_system.h"
#include "storage/s3/task_pool.h"

namespace dcp::storage::s3 {

struct S3ReadableFile::Fetch {
  // Not zero-filled: the GET writes every byte before a reader sees any. Counted in `alive`
  // (the file system's fetched bytes) while it exists; its buffer goes back to `buffers`.
  Fetch(uint64_t bytes, std::atomic<uint64_t>& alive, FetchBuffers& buffers)
      : buffer(buffers.Take(bytes)),
        data(buffer.data.get(), bytes),
        alive(alive),
        buffers(buffers) {
    alive += bytes;
  }
  ~Fetch() {
    alive -= data.size();
    buffers.Give(std::move(buffer));
  }

  Status Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status;
  }
  bool Done() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  void Finish(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      done = true;
    }
    cv.notify_all();
  }

  FetchBuffers::Buffer buffer;
  std::span<std::byte> data;
  std::atomic<uint64_t>& alive;
  FetchBuffers& buffers;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};

S3ReadableFile::S3ReadableFile(S3FileSystem& fs, S3Location loc, std::string path, uint64_t size)
    : fs_(fs), loc_(std::move(loc)), path_(std::move(path)), size_(size) {
  fs_.fetch_buffers().FileOpened();
}

S3ReadableFile::~S3ReadableFile() {
  for (const std::weak_ptr<Fetch>& w : started_) {
    if (std::shared_ptr<Fetch> f = w.lock()) (void)f->Wait();
  }
  fs_.fetch_buffers().FileClosed();
}

void S3ReadableFile::WillRead(std::span<const ByteRange> ranges) {
  const uint64_t part = fs_.client().config().part_bytes;
  std::vector<ByteRange> sorted;
  for (const ByteRange& r : ranges) {
    if (r.length > 0 && r.offset <= size_ && r.length <= size_ - r.offset) sorted.push_back(r);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  // Overlapping ranges as one, so that an extent waits for each byte once (touching ones stay
  // apart: merged, a run of small chunks would be cut at part boundaries inside chunks).
  std::vector<ByteRange> merged;
  for (const ByteRange& r : sorted) {
    if (!merged.empty() && r.offset < merged.back().offset + merged.back().length) {
      ByteRange& m = merged.back();
      m.length = std::max(m.offset + m.length, r.offset + r.length) - m.offset;
    } else {
      merged.push_back(r);
    }
  }
  sorted = std::move(merged);
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Extent> added;
  for (const ByteRange& r : sorted) {
    // What earlier announcements cover is read from their extents (which now wait for these
    // bytes too); the rest becomes extents of its own.
    for (const ByteRange& piece : Uncovered(r.offset, r.offset + r.length)) {
      const uint64_t begin =
          added.empty() ? piece.offset : std::max(piece.offset, added.back().end);
      const uint64_t end = piece.offset + piece.length;
      if (begin >= end) continue;
      if (end - begin > part) {
        // A large range: part-sized extents, used when it is read piece by piece (a chunk
        // streamed through a bounce buffer); read whole, it goes straight out instead.
        ++group_;
        for (uint64_t at = begin; at < end; at += part) {
          const uint64_t piece_end = std::min(end, at + part);
          added.push_back({at, piece_end, group_, piece_end - at});
        }
        ++group_;
        continue;
      }
      // Merged across a gap only where no earlier extent lies in it (extents never overlap).
      if (!added.empty() && added.back().group == group_ && begin <= added.back().end + kGap &&
          end - added.back().begin <= kMergedParts * part && Free(added.back().end, begin)) {
        added.back().end = end;
        added.back().wanted += end - begin;
        continue;
      }
      added.push_back({begin, end, group_, end - begin});
    }
  }
  for (Extent& e : added) extents_.push_back(std::move(e));
  std::sort(extents_.begin(), extents_.end(),
            [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  StartEarly();
}

void S3ReadableFile::StartEarly() {
  // A load reads its files in broadcast order, not file by file: a file whose first read
  // comes late would otherwise sit idle while the store could already be sending it.
  const S3Config& config = fs_.client().config();
  const uint64_t budget = static_cast<uint64_t>(config.connections) * config.part_bytes;
  size_t started = 0;
  for (Extent& e : extents_) {
    if (started == static_cast<size_t>(config.connections)) break;
    // Pieces of a large range are fetched only once a read inside it shows it is read piece
    // by piece (FetchAhead); read whole, it goes straight out.
    if (e.fetch || e.served > 0 || e.group % 2 != 0) continue;
    if (fs_.fetched_bytes() + (e.end - e.begin) > budget) break;
    Start(e);
    ++started;
  }
}

Status S3ReadableFile::ReadAt(uint64_t offset, std::span<std::byte> dst) {
  if (offset > size_ || dst.size() > size_ - offset) {
    return DataLoss(path_ + " ends at byte " + std::to_string(size_) + ", before " +
                    std::to_string(offset + dst.size()));
  }
  S3Client& client = fs_.client();
  const uint64_t part = client.config().part_bytes;
  if (dst.size() <= part) {
    std::unique_lock<std::mutex> lock(mu_);
    const size_t i = Find(offset, dst.size());
    if (i < extents_.size()) return ReadExtent(i, offset, dst, lock);
    lock.unlock();
    return client.GetRange(loc_.bucket, loc_.key, offset, dst);
  }
  // Large reads: parallel ranged GETs, one per connection within 1 to 4 parts.
  TaskGroup group(fs_.pool(), static_cast<size_t>(client.config().connections));
  const uint64_t piece_bytes = PartBytesFor(client.config(), dst.size());
  for (uint64_t at = 0; at < dst.size(); at += piece_bytes) {
    std::span<std::byte> piece = dst.subspan(at, std::min<uint64_t>(piece_bytes, dst.size() - at));
    group.Run([&client, this, offset, at, piece] {
      return client.GetRange(loc_.bucket, loc_.key, offset + at, piece);
    });
  }
  return group.Wait();
}

Status S3ReadableFile::ReadExtent(size_t i, uint64_t offset, std::span<std::byte> dst,
                                  std::unique_lock<std::mutex>& lock) {
  StartWindow(i);
  const std::shared_ptr<Fetch> fetch = extents_[i].fetch;
  const uint64_t begin = extents_[i].begin;
  lock.unlock();
  Status s = fetch->Wait();
  if (s.ok()) std::memcpy(dst.data(), fetch->data.data() + (offset - begin), dst.size());
  lock.lock();
  // Extents may have been added meanwhile: found again by where it begins.
  auto it = std::lower_bound(extents_.begin(), extents_.end(), begin,
                             [](const Extent& e, uint64_t b) { return e.begin < b; });
  if (it == extents_.end() || it->begin != begin) return s;
  if (!s.ok()) {
    if (it->fetch == fetch) it->fetch.reset();  // a later read asks again
    return s;
  }
  it->served += dst.size();
  // Its announced bytes all read: gone (a gap merged in is never read). A later read there
  // goes out alone, and a later announcement makes an extent of its own.
  if (it->served >= it->wanted) extents_.erase(it);
  return OkStatus();
}

size_t S3ReadableFile::Find(uint64_t offset, uint64_t length) const {
  auto it = std::upper_bound(extents_.begin(), extents_.end(), offset,
                             [](uint64_t o, const Extent& e) { return o < e.begin; });
  if (it == extents_.begin() || std::prev(it)->end < offset + length) return extents_.size();
  return static_cast<size_t>(std::prev(it) - extents_.begin());
}

bool S3ReadableFile::Free(uint64_t begin, uint64_t end) const {
  auto it = std::upper_bound(extents_.begin(), extents_.end(), begin,
                             [](uint64_t o, const Extent& e) { return o < e.begin; });
  if (it != extents_.begin() && std::prev(it)->end > begin) return false;
  return it == extents_.end() || it->begin >= end;
}

std::vector<ByteRange> S3ReadableFile::Uncovered(uint64_t begin, uint64_t end) {
  std::vector<ByteRange> out;
  auto it = std::upper_bound(extents_.begin(), extents_.end(), begin,
                             [](uint64_t o, const Extent& e) { return o < e.begin; });
  if (it != extents_.begin() && std::prev(it)->end > begin) --it;
  uint64_t at = begin;
  for (; it != extents_.end() && it->begin < end; ++it) {
    if (it->begin > at) out.push_back({at, it->begin - at});
    const uint64_t lo = std::max(at, it->begin), hi = std::min(end, it->end);
    if (hi > lo) it->wanted += hi - lo;
    at = std::max(at, it->end);
  }
  if (at < end) out.push_back({at, end - at});
  return out;
}

// Extent k is fetched ahead of a read of extent i: small ones always, pieces of a large range
// only with a read inside that range (a whole read of it does not use them).
bool S3ReadableFile::FetchAhead(size_t i, size_t k) const {
  return extents_[k].group % 2 == 0 || extents_[k].group == extents_[i].group;
}

void S3ReadableFile::StartWindow(size_t i) {
  const S3Config& config = fs_.client().config();
  const size_t ahead = static_cast<size_t>(config.connections);
  const size_t end = std::min(extents_.size(), i + ahead);
  const uint64_t budget = 2 * ahead * config.part_bytes;
  for (size_t k = i; k < end; ++k) {
    Extent& e = extents_[k];
    if (e.fetch || (k > i && (e.served > 0 || !FetchAhead(i, k)))) continue;
    // Ahead of the read only while the rank's buffers (every file's) stay within the budget:
    // a load with many files open holds one window in all, not one per file.
    if (k > i && fs_.fetched_bytes() + (e.end - e.begin) > budget) break;
    Start(e);
  }
  uint64_t held = 0;
  for (const Extent& e : extents_) held += e.fetch ? e.end - e.begin : 0;
  while (held > budget) {
    Extent* oldest = nullptr;
    for (size_t k = 0; k < extents_.size(); ++k) {
      Extent& e = extents_[k];
      if (e.fetch && (k < i || k >= end) && e.fetch->Done() &&
          (!oldest || e.started < oldest->started)) {
        oldest = &e;
      }
    }
    if (!oldest) break;  // the rest are in the window or still on the wire
    held -= oldest->end - oldest->begin;
    oldest->fetch.reset();
  }
}

void S3ReadableFile::Start(Extent& e) {
  auto fetch = std::make_shared<Fetch>(e.end - e.begin, fs_.fetched_bytes(), fs_.fetch_buffers());
  e.fetch = fetch;
  e.started = ++starts_;
  if (started_.size() >= prune_at_) {  // amortised: the list stays near the GETs alive
    std::erase_if(started_, [](const std::weak_ptr<Fetch>& w) { return w.expired(); });
    prune_at_ = std::max<size_t>(64, 2 * started_.size());
  }
  started_.push_back(fetch);
  fs_.pool().Submit([&client = fs_.client(), bucket = loc_.bucket, key = loc_.key, begin = e.begin,
                     fetch] { fetch->Finish(client.GetRange(bucket, key, begin, fetch->data)); });
}

}  // namespace dcp::storage::s3
