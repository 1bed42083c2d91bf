#include "storage/s3/fetch_buffers.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace dcp::storage::s3 {

FetchBuffers::Buffer FetchBuffers::Take(uint64_t bytes) {
  if (bytes < kKeptFrom) return {std::make_unique_for_overwrite<std::byte[]>(bytes), bytes};
  const uint64_t whole = (bytes + kKeptFrom - 1) / kKeptFrom * kKeptFrom;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t largest = std::max(whole, bytes + bytes / 4);
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->capacity >= bytes && it->capacity <= largest &&
          (best == kept_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != kept_.end()) {
      Buffer b = std::move(*best);
      kept_bytes_ -= b.capacity;
      kept_.erase(best);
      return b;
    }
  }
  return {std::make_unique_for_overwrite<std::byte[]>(whole), whole};
}

void FetchBuffers::Give(Buffer buffer) {
  if (buffer.capacity < kKeptFrom || buffer.capacity > max_bytes_) return;
  std::vector<Buffer> dropped;  // freed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (open_files_ == 0) return;
  while (kept_bytes_ + buffer.capacity > max_bytes_) {
    kept_bytes_ -= kept_.front().capacity;
    dropped.push_back(std::move(kept_.front()));
    kept_.pop_front();
  }
  kept_bytes_ += buffer.capacity;
  kept_.push_back(std::move(buffer));
}

void FetchBuffers::FileOpened() {
  std::lock_guard<std::mutex> lock(mu_);
  ++open_files_;
}

void FetchBuffers::FileClosed() {
  std::deque<Buffer> freed;  // freed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (--open_files_ > 0) return;
  freed.swap(kept_);
  kept_bytes_ = 0;
}

uint64_t FetchBuffers::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_bytes_;
}

}  // namespace dcp::storage::s3
