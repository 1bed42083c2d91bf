#include "async/staging_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace dcp::async {
namespace {

class HostAllocator final : public StagingAllocator {
 public:
  Result<std::span<std::byte>> Allocate(uint64_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return Unavailable(Describe("mmap", bytes, errno));
    if (!Prefault(p, bytes)) {
      int err = errno;
      munmap(p, bytes);
      return Unavailable(Describe("pre-faulting", bytes, err));
    }
    // Huge pages mean fewer TLB misses while copying; a hint, so failure is fine. Given
    // after faulting in: asked for before, each fault may compact memory for a huge page
    // (THP defrag "madvise", Debian's default), which made pre-faulting 161 MiB 2-6x slower
    // here (0.18-0.43 s against 0.07-0.10 s); given now, khugepaged collapses the buffer
    // later, in the background.
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    return std::span<std::byte>(static_cast<std::byte*>(p), bytes);
  }
  void Free(std::span<std::byte> block) override { munmap(block.data(), block.size()); }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  std::string_view name() const override { return "host"; }

 private:
  static bool Prefault(void* p, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return true;
    if (errno != EINVAL) return false;  // out of memory: a memset would be killed instead
#endif
    std::memset(p, 0, bytes);
    return true;
  }
  static std::string Describe(const char* op, uint64_t bytes, int err) {
    return std::string("staging memory: ") + op + " of " + std::to_string(bytes) +
           " bytes failed: " + std::strerror(err);
  }
};

uint64_t RoundUpToPage(uint64_t n) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

}  // namespace

std::unique_ptr<StagingAllocator> NewHostAllocator() { return std::make_unique<HostAllocator>(); }

StagingPool::StagingPool(std::unique_ptr<StagingAllocator> allocator, uint64_t max_bytes)
    : allocator_(std::move(allocator)), max_bytes_(max_bytes) {}

StagingPool::~StagingPool() {
  for (Buffer& b : buffers_) {
    if (!b.block.empty()) allocator_->Free(b.block);
  }
}

Result<StagingPool::Lease> StagingPool::Acquire(uint64_t bytes, std::chrono::milliseconds timeout) {
  const uint64_t need = RoundUpToPage(bytes == 0 ? 1 : bytes);
  if (max_bytes_ > 0 && need > max_bytes_) {
    return InvalidArgument("the state dict needs " + std::to_string(bytes) +
                           " bytes of staging memory, more than max_staging_bytes (" +
                           std::to_string(max_bytes_) + ")");
  }
  const uint64_t cap = max_bytes_ > 0 ? max_bytes_ : need;
  const auto start = std::chrono::steady_clock::now();
  Lease lease;
  std::unique_lock lock(mu_);
  while (true) {
    // Best fit among idle buffers.
    int best = -1;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const Buffer& b = buffers_[i];
      if (b.busy || b.block.size() < need) continue;
      if (best < 0 || b.block.size() < buffers_[best].block.size()) best = static_cast<int>(i);
    }
    if (best >= 0 && (max_bytes_ > 0 || bytes_in_use_ == 0)) {
      buffers_[best].busy = true;
      bytes_in_use_ += buffers_[best].block.size();
      lease.id = best;
      lease.block = buffers_[best].block;
      break;
    }
    // A new buffer, if idle ones (all too small) can make room for it under the cap.
    uint64_t idle = 0;
    for (const Buffer& b : buffers_) idle += b.busy ? 0 : b.block.size();
    if (bytes_allocated_ - idle + need <= cap) {
      for (Buffer& b : buffers_) {
        if (b.busy || b.block.empty() || bytes_allocated_ + need <= cap) continue;
        allocator_->Free(b.block);
        bytes_allocated_ -= b.block.size();
        b.block = {};
      }
      int slot = -1;
      for (size_t i = 0; i < buffers_.size() && slot < 0; ++i) {
        if (!buffers_[i].busy && buffers_[i].block.empty()) slot = static_cast<int>(i);
      }
      if (slot < 0) {
        slot = static_cast<int>(buffers_.size());
        buffers_.emplace_back();
      }
      // Reserve the slot and the bytes, then allocate (pre-faulting is slow) unlocked.
      buffers_[slot].busy = true;
      bytes_allocated_ += need;
      bytes_in_use_ += need;
      lock.unlock();
      auto block = allocator_->Allocate(need);
      lock.lock();
      if (!block.ok()) {
        buffers_[slot].busy = false;
        bytes_allocated_ -= need;
        bytes_in_use_ -= need;
        released_.notify_all();
        return block.status();
      }
      buffers_[slot].block = *block;
      ++allocations_;
      lease.id = slot;
      lease.block = *block;
      lease.bytes_allocated = need;
      lease.allocations = 1;
      break;
    }
    // Back-pressure: a busy buffer will be released when its save has persisted.
    ++waiting_;
    const bool woken = released_.wait_until(lock, start + timeout) == std::cv_status::no_timeout;
    --waiting_;
    if (!woken) {
      return DeadlineExceeded(
          "async save waited " + std::to_string(timeout.count()) + " ms for " +
          std::to_string(need) + " bytes of staging memory, but " + std::to_string(bytes_in_use_) +
          " bytes stay busy in earlier saves that have not persisted (cap " + std::to_string(cap) +
          " bytes, max_staging_bytes): an earlier save is stuck; wait for it or raise "
          "max_staging_bytes");
    }
  }
  lease.wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return lease;
}

void StagingPool::Release(int id) {
  {
    std::lock_guard lock(mu_);
    Buffer& b = buffers_.at(static_cast<size_t>(id));
    b.busy = false;
    bytes_in_use_ -= b.block.size();
  }
  released_.notify_all();
}

StagingPool::Stats StagingPool::stats() const {
  std::lock_guard lock(mu_);
  Stats s;
  s.bytes_allocated = bytes_allocated_;
  s.bytes_in_use = bytes_in_use_;
  s.allocations = allocations_;
  s.waiting = waiting_;
  for (const Buffer& b : buffers_) s.buffers += b.block.empty() ? 0 : 1;
  return s;
}

}  // namespace dcp::async
