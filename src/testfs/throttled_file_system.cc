#include "testfs/throttled_file_system.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <ctime>

namespace dcp::testfs {
namespace {

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

class ThrottledReadableFile final : public storage::ReadableFile {
 public:
  ThrottledReadableFile(std::unique_ptr<storage::ReadableFile> base, BandwidthLimiter& limiter,
                        uint64_t slice)
      : base_(std::move(base)), limiter_(limiter), slice_(slice) {}

  // WillRead is not passed on (the default ignores it): the kernel would fetch the announced
  // bytes ahead, past the token bucket, and the cap would no longer hold.

  Status ReadAt(uint64_t offset, std::span<std::byte> dst) override {
    while (!dst.empty()) {
      const size_t n = std::min<uint64_t>(dst.size(), slice_);
      // Read while the reservation runs: the slice takes max(its budget, the real read).
      const int64_t end = limiter_.Reserve(n);
      DCP_RETURN_IF_ERROR(base_->ReadAt(offset, dst.first(n)));
      BandwidthLimiter::WaitUntil(end);
      offset += n;
      dst = dst.subspan(n);
    }
    return OkStatus();
  }
  uint64_t size() const override { return base_->size(); }
  const std::string& path() const override { return base_->path(); }

 private:
  std::unique_ptr<storage::ReadableFile> base_;
  BandwidthLimiter& limiter_;
  uint64_t slice_;
};

}  // namespace

BandwidthLimiter::BandwidthLimiter(double rate, int64_t* clock, void* mapping, size_t mapping_size)
    : rate_(rate), clock_(clock), mapping_(mapping), mapping_size_(mapping_size) {}

BandwidthLimiter::~BandwidthLimiter() {
  if (mapping_) ::munmap(mapping_, mapping_size_);
}

std::unique_ptr<BandwidthLimiter> BandwidthLimiter::InProcess(double bytes_per_second) {
  auto owned = std::make_unique<int64_t>(0);
  int64_t* clock = owned.get();
  std::unique_ptr<BandwidthLimiter> l(new BandwidthLimiter(bytes_per_second, clock, nullptr, 0));
  l->owned_ = std::move(owned);
  return l;
}

Result<std::unique_ptr<BandwidthLimiter>> BandwidthLimiter::Shared(const std::string& path,
                                                                   double bytes_per_second) {
  static_assert(std::atomic_ref<int64_t>::is_always_lock_free,
                "a process-shared limiter needs a lock-free 64-bit atomic");
  const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("open bandwidth limiter", path, errno);
  // Growing to one page is idempotent and zero-fills: a fresh clock reads 0 ("free now").
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus("size bandwidth limiter", path, err);
  }
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) return ErrnoStatus("map bandwidth limiter", path, err);
  return std::unique_ptr<BandwidthLimiter>(
      new BandwidthLimiter(bytes_per_second, static_cast<int64_t*>(m), m, size));
}

void BandwidthLimiter::WaitUntil(int64_t deadline_ns) {
  timespec ts{static_cast<time_t>(deadline_ns / 1'000'000'000),
              static_cast<long>(deadline_ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

int64_t BandwidthLimiter::Reserve(uint64_t bytes) {
  const auto cost = static_cast<int64_t>(static_cast<double>(bytes) / rate_ * 1e9);
  std::atomic_ref<int64_t> clock(*clock_);
  const int64_t now = MonotonicNanos();
  int64_t free_from = clock.load(std::memory_order_relaxed);
  int64_t end;
  do {
    end = std::max(free_from, now) + cost;
  } while (!clock.compare_exchange_weak(free_from, end, std::memory_order_relaxed));
  return end;
}

Result<std::unique_ptr<storage::ReadableFile>> ThrottledFileSystem::OpenReadable(
    const std::string& path) {
  DCP_ASSIGN_OR_RETURN(auto f, base_.OpenReadable(path));
  return std::unique_ptr<storage::ReadableFile>(
      new ThrottledReadableFile(std::move(f), limiter_, slice_));
}

}  // namespace dcp::testfs
