// The staging pool: host buffers an async save copies the caller's state into, reused across
// saves and bounded by a memory cap.
//
// Buffers come from a StagingAllocator, a small interface so that other memory (CUDA pinned
// host memory, for device tensors) can be added without changing the pool or the public API.
// Every buffer is pre-faulted when allocated, so a save that reuses one copies at memcpy
// speed with no page fault.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "dcp/status.h"
#include "dcp/tensor.h"

namespace dcp::async {

class StagingAllocator {
 public:
  virtual ~StagingAllocator() = default;
  // A block of exactly `bytes` (> 0), every page already backed by memory. kUnavailable when
  // the memory cannot be had.
  virtual Result<std::span<std::byte>> Allocate(uint64_t bytes) = 0;
  // Returns a block from Allocate.
  virtual void Free(std::span<std::byte> block) = 0;
  // Where the blocks live, and a name for messages.
  virtual MemoryKind memory() const = 0;
  virtual std::string_view name() const = 0;
};

// Anonymous private mappings, huge pages requested (madvise), pre-faulted with
// MADV_POPULATE_WRITE (or a memset on kernels without it).
std::unique_ptr<StagingAllocator> NewHostAllocator();

// Buffers handed out whole, one per save. Thread-safe: Acquire on the saving thread, Release on
// the persisting thread.
class StagingPool {
 public:
  // `max_bytes` caps the memory held (busy and idle buffers); 0 caps it at the request being
  // served, so a request waits until no buffer is busy.
  StagingPool(std::unique_ptr<StagingAllocator> allocator, uint64_t max_bytes);
  // Frees every buffer; none may be busy.
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  struct Lease {
    int id = -1;                   // for Release
    std::span<std::byte> block;    // at least the requested size
    uint64_t bytes_allocated = 0;  // new memory allocated for this request
    uint64_t allocations = 0;      // 0 or 1
    double wait_seconds = 0;       // waited for busy buffers to be released
  };
  // A buffer of at least `bytes`: the smallest idle one that fits, else a new one, after
  // freeing idle buffers that are too small. Waits while a new one would exceed the cap.
  // kInvalidArgument when `bytes` exceeds a non-zero cap (it could never be served);
  // kDeadlineExceeded, naming the busy bytes and the cap, after waiting `timeout` in total.
  Result<Lease> Acquire(uint64_t bytes,
                        std::chrono::milliseconds timeout = std::chrono::minutes(10));
  void Release(int id);

  struct Stats {
    uint64_t bytes_allocated = 0;  // held now
    uint64_t bytes_in_use = 0;
    uint64_t allocations = 0;  // since creation
    uint64_t buffers = 0;      // held now
    uint64_t waiting = 0;      // Acquire calls blocked by back-pressure now
  };
  Stats stats() const;

 private:
  struct Buffer {
    std::span<std::byte> block;  // empty while its allocation is in progress
    bool busy = false;
  };

  const std::unique_ptr<StagingAllocator> allocator_;
  const uint64_t max_bytes_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable released_;
  std::vector<Buffer> buffers_;   // by id; freed ones keep their slot with an empty block
  uint64_t waiting_ = 0;          // Acquire calls in released_.wait
  uint64_t bytes_allocated_ = 0;  // including reservations of allocations in progress
  uint64_t bytes_in_use_ = 0;
  uint64_t allocations_ = 0;
};

}  // namespace dcp::async
