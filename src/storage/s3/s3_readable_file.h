// Reads of one S3 object by ranged GETs, with read-ahead over the ranges a load announced.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "storage/file_system.h"
#include "storage/s3/s3_client.h"

namespace dcp::storage::s3 {

class S3FileSystem;

// Announced ranges (WillRead) become extents: neighbours less than kGap apart merged up to
// kMergedParts parts (larger ranges cut into parts). The first of them are fetched at once while
// the file system holds less than one window of fetched bytes across its files. A read inside an
// extent starts the GETs of it and of the next `connections` extents, then waits for its own only:
// while the caller uses one extent, the following ones are on the wire, and every read slides that
// window on. An extent goes once the bytes announced in it have all been read; the oldest fetched
// go when more than two windows' worth are held, so memory stays bounded whatever order the reads
// come in. Reads larger than a part go straight out, in parallel GETs of 1 to 4 parts
// (PartBytesFor). No lock is held while
// waiting on the network: readers of other extents of the file go on.
class S3ReadableFile final : public ReadableFile {
 public:
  static constexpr uint64_t kGap = uint64_t{1} << 20;
  // Two parts: half the GETs of one-part extents for runs of chunks (a load's own shards, a
  // reshard's slabs), while a read's window (its budget is two windows of parts) still keeps a
  // GET in flight per connection; the early starts (one window's budget) start half as many.
  static constexpr uint64_t kMergedParts = 2;

  S3ReadableFile(S3FileSystem& fs, S3Location loc, std::string path, uint64_t size);
  ~S3ReadableFile() override;  // waits for the GETs it started

  // Adds extents for `ranges`; what an extent already announced covers is read from it.
  void WillRead(std::span<const ByteRange> ranges) override;
  Status ReadAt(uint64_t offset, std::span<std::byte> dst) override;
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  struct Fetch;  // one extent's GET, shared with the pool task that runs it
  struct Extent {
    uint64_t begin, end;
    uint32_t group;       // the pieces of one large range share an odd group; small ones even
    uint64_t wanted = 0;  // bytes announced in it (gaps merged in are not)
    std::shared_ptr<Fetch> fetch = nullptr;  // null until started, and once read or evicted
    uint64_t served = 0;                     // bytes read from it so far
    uint64_t started = 0;                    // start order, for eviction
  };

  // The extent holding [offset, offset + length), or extents_.size(). Holds mu_.
  size_t Find(uint64_t offset, uint64_t length) const;
  // The parts of [begin, end) no extent covers; the extents covering the rest count those
  // bytes as wanted. Holds mu_.
  std::vector<ByteRange> Uncovered(uint64_t begin, uint64_t end);
  // Whether no extent lies in [begin, end). Holds mu_.
  bool Free(uint64_t begin, uint64_t end) const;
  bool FetchAhead(size_t i, size_t k) const;
  // Extent i and the next ones started; the oldest finished beyond the budget dropped.
  void StartWindow(size_t i);
  // The first extents not yet fetched, while the file system's fetched bytes stay within one
  // window (`connections` parts). Holds mu_.
  void StartEarly();
  void Start(Extent& e);
  Status ReadExtent(size_t i, uint64_t offset, std::span<std::byte> dst,
                    std::unique_lock<std::mutex>& lock);

  S3FileSystem& fs_;
  S3Location loc_;
  std::string path_;
  uint64_t size_;
  std::mutex mu_;
  std::vector<Extent> extents_;                // ascending, disjoint
  std::vector<std::weak_ptr<Fetch>> started_;  // to wait for at the end
  size_t prune_at_ = 64;
  uint32_t group_ = 0;
  uint64_t starts_ = 0;
};

}  // namespace dcp::storage::s3
