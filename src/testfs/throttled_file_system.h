// A storage::FileSystem whose reads are capped at a given bandwidth: emulated slow shared storage.
//
// One machine with a fast local disk hides what read-once broadcast is for: on a shared
// parallel file system many ranks reading the same shard compete for one aggregate
// bandwidth. ThrottledFileSystem reproduces that: every ReadAt of the files it opens
// first reserves its bytes on a BandwidthLimiter, a "virtual clock" token bucket, and
// returns no earlier than the reservation ends. Writes and metadata operations pass through.
//
// The limiter can live in shared memory (a small file mapped by every process that opens
// the same path), so all ranks of one machine share one aggregate budget whatever their
// number; an in-process limiter serves threads and tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "storage/file_system.h"

namespace dcp::testfs {

// Thread- and process-safe: reservations are one atomic compare-and-swap on a shared
// 64-bit "budget free from" time (CLOCK_MONOTONIC nanoseconds, system-wide).
class BandwidthLimiter {
 public:
  // A limiter private to this process.
  static std::unique_ptr<BandwidthLimiter> InProcess(double bytes_per_second);
  // A limiter shared by every process on this machine that opens `path` (created if
  // missing, e.g. under /dev/shm). The caller removes the file when all are done.
  static Result<std::unique_ptr<BandwidthLimiter>> Shared(const std::string& path,
                                                          double bytes_per_second);
  ~BandwidthLimiter();
  BandwidthLimiter(const BandwidthLimiter&) = delete;
  BandwidthLimiter& operator=(const BandwidthLimiter&) = delete;

  // Reserves `bytes` of the budget: the interval [start, start + bytes / rate) with start =
  // max(now, end of the last reservation). Returns its end (CLOCK_MONOTONIC ns); the caller
  // does its I/O and then WaitUntil(end). An idle limiter accumulates no credit, so the
  // long-run rate never exceeds bytes_per_second.
  int64_t Reserve(uint64_t bytes);
  static void WaitUntil(int64_t deadline_ns);
  double bytes_per_second() const { return rate_; }

 private:
  BandwidthLimiter(double rate, int64_t* clock, void* mapping, size_t mapping_size);

  double rate_;
  int64_t* clock_;  // ns; in mapping_ (shared) or owned_ (in process)
  void* mapping_;
  size_t mapping_size_;
  std::unique_ptr<int64_t> owned_;
};

class ThrottledFileSystem final : public storage::FileSystem {
 public:
  // Reads are sliced into pieces of at most `slice_bytes` so concurrent readers share
  // the budget fairly. `base` and `limiter` must outlive this object.
  ThrottledFileSystem(storage::FileSystem& base, BandwidthLimiter& limiter,
                      uint64_t slice_bytes = uint64_t{4} << 20)
      : base_(base), limiter_(limiter), slice_(slice_bytes) {}

  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& path) override {
    return base_.NewWritableFile(path);
  }
  Result<std::unique_ptr<storage::ReadableFile>> OpenReadable(const std::string& path) override;
  Result<std::unique_ptr<storage::WritableFile>> ReuseFile(const std::string& old_path,
                                                           const std::string& path) override {
    return base_.ReuseFile(old_path, path);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return base_.Rename(from, to);
  }
  Status SyncDir(const std::string& dir) override { return base_.SyncDir(dir); }
  Status Remove(const std::string& path) override { return base_.Remove(path); }
  Status RemoveTree(const std::string& path) override { return base_.RemoveTree(path); }
  Status CreateDirs(const std::string& dir) override { return base_.CreateDirs(dir); }
  Result<std::vector<std::string>> List(const std::string& dir) override { return base_.List(dir); }
  Result<uint64_t> FileSize(const std::string& path) override { return base_.FileSize(path); }
  // The limiter is one atomic in shared memory.
  bool ConcurrentReads() const override { return base_.ConcurrentReads(); }
  // Every rank's read is charged against the storage's bandwidth, as by storage no cache of
  // the host sits in front of: the ranks of a host do not share reads.
  bool HostSharesReads() const override { return false; }

 private:
  storage::FileSystem& base_;
  BandwidthLimiter& limiter_;
  uint64_t slice_;
};

}  // namespace dcp::testfs
