#include "storage/s3/fetch_buffers.h"

#include <utility>

namespace dcp::storage::s3 {

FetchBuffers::Buffer FetchBuffers::Take(uint64_t bytes) {
  if (bytes >= kKeptFrom) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.lower_bound(bytes);
    if (it != kept_.end() && it->first <= bytes + bytes / 4) {
      Buffer b{std::move(it->second), it->first};
      kept_bytes_ -= it->first;
      kept_.erase(it);
      return b;
    }
  }
  // Rounded up to whole MiB, so that extents of nearly one size share buffers.
  const uint64_t capacity =
      bytes >= kKeptFrom ? (bytes + kKeptFrom - 1) / kKeptFrom * kKeptFrom : bytes;
  return {std::make_unique_for_overwrite<std::byte[]>(capacity), capacity};
}

void FetchBuffers::Give(Buffer buffer) {
  if (buffer.capacity < kKeptFrom) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (open_files_ == 0 || kept_bytes_ + buffer.capacity > max_bytes_) return;  // freed here
  kept_bytes_ += buffer.capacity;
  kept_.emplace(buffer.capacity, std::move(buffer.data));
}

void FetchBuffers::FileOpened() {
  std::lock_guard<std::mutex> lock(mu_);
  ++open_files_;
}

void FetchBuffers::FileClosed() {
  std::multimap<uint64_t, std::unique_ptr<std::byte[]>> freed;  // freed outside the lock
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
