#include "async/copy_threads.h"

#include <algorithm>
#include <cstring>

namespace dcp::async {
namespace {

// Below this many bytes per thread, waking another thread costs more than it saves.
constexpr uint64_t kMinBytesPerThread = uint64_t{8} << 20;

}  // namespace

CopyThreads::CopyThreads(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) {
    workers_.emplace_back([this, i](std::stop_token stop) { WorkerLoop(stop, i); });
  }
}

CopyThreads::~CopyThreads() {
  for (auto& w : workers_) w.request_stop();
  wake_.notify_all();
  workers_.clear();  // joins
}

int CopyThreads::Copy(const std::vector<CopyPiece>& pieces) {
  starts_.resize(pieces.size());
  uint64_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    starts_[i] = total;
    total += pieces[i].size;
  }
  const int n = static_cast<int>(
      std::clamp<uint64_t>(total / kMinBytesPerThread, 1, static_cast<uint64_t>(threads())));
  {
    std::lock_guard lock(mu_);
    pieces_ = &pieces;
    total_ = total;
    active_ = n;
    remaining_ = n - 1;
    ++generation_;
  }
  if (n > 1) wake_.notify_all();
  CopyRange(0, n);
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return remaining_ == 0; });
  pieces_ = nullptr;
  return n;
}

void CopyThreads::CopyRange(int k, int n) {
  const std::vector<CopyPiece>& pieces = *pieces_;
  const uint64_t lo = total_ * k / n, hi = total_ * (k + 1) / n;
  if (lo >= hi) return;
  // The piece holding byte `lo`.
  size_t i = std::upper_bound(starts_.begin(), starts_.end(), lo) - starts_.begin() - 1;
  for (uint64_t pos = lo; pos < hi; ++i) {
    const CopyPiece& p = pieces[i];
    const uint64_t from = pos - starts_[i];
    const uint64_t len = std::min(p.size - from, hi - pos);
    if (len > 0) std::memcpy(p.dst + from, p.src + from, len);
    pos += len;
  }
}

void CopyThreads::WorkerLoop(std::stop_token stop, int index) {
  uint64_t seen = 0;
  while (true) {
    int n;
    {
      std::unique_lock lock(mu_);
      if (!wake_.wait(lock, stop, [&] { return generation_ != seen; })) return;
      seen = generation_;
      n = active_;
    }
    if (index >= n) continue;  // not needed for this job
    CopyRange(index, n);
    {
      std::lock_guard lock(mu_);
      --remaining_;
    }
    done_.notify_one();
  }
}

}  // namespace dcp::async
