// Buffers of an S3 file system's ranged GETs, kept from one read-ahead extent to the next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

namespace dcp::storage::s3 {

// A fresh buffer's pages are faulted in and zeroed by the kernel at first touch, which costs
// about as much CPU per byte as receiving them. A load fetches many extents of a few sizes
// (the parts of its large ranges), so the buffer one extent frees serves the next. Buffers are
// kept only while a readable file is open, at most `max_bytes` of them (beyond the fetched
// bytes a read's window counts), the oldest dropped first: a process that loaded once does not
// hold them through training.
class FetchBuffers {
 public:
  // Smaller buffers come from malloc's free lists; the allocator maps larger ones afresh (from
  // 32 MiB on always, below that as its threshold moves).
  static constexpr uint64_t kKeptFrom = uint64_t{1} << 20;

  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    uint64_t capacity = 0;
  };

  explicit FetchBuffers(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // At least `bytes`, not zero-filled: the smallest kept one that fits and is no larger than a
  // new one would be (whole MiB) or a quarter over `bytes`, else a new one of whole MiB.
  Buffer Take(uint64_t bytes);
  // Kept for a later Take while a file is open, the oldest kept dropped to make room.
  void Give(Buffer buffer);

  void FileOpened();
  // The last open file closed: every kept buffer is freed.
  void FileClosed();

  uint64_t kept_bytes() const;

 private:
  mutable std::mutex mu_;
  std::deque<Buffer> kept_;  // oldest first
  uint64_t kept_bytes_ = 0;
  const uint64_t max_bytes_;
  int open_files_ = 0;
};

}  // namespace dcp::storage::s3
