#include "checkpoint/in_flight.h"

#include <algorithm>

namespace dcp::checkpoint {

InFlight::~InFlight() {
  for (Op& op : ops_) {
    (void)op.staging.data.release();
    (void)op.request.release();
  }
}

InFlight::Buffer InFlight::Take(uint64_t bytes) {
  Buffer b;
  if (auto kept = Reusable(bytes); kept != free_.end()) {
    b = std::move(*kept);
    free_.erase(kept);
    free_bytes_ -= b.capacity;
    held_ += b.capacity - bytes;
  } else {
    b.data = std::make_unique_for_overwrite<std::byte[]>(std::max<uint64_t>(bytes, 1));
    b.capacity = bytes;
  }
  b.size = bytes;
  return b;
}

Status InFlight::Reserve(uint64_t bytes, bool staged) {
  while (true) {
    const bool reuse = staged && Reusable(bytes) != free_.end();
    const uint64_t more = reuse ? 0 : bytes;
    if (held_ + free_bytes_ + more > max_held_ && !reuse && !free_.empty()) {
      ReleaseKept();
    } else if (!ops_.empty() && (held_ + free_bytes_ + more > max_held_ || ops_.size() >= limit_)) {
      DCP_RETURN_IF_ERROR(WaitOldest());
    } else {
      break;
    }
  }
  held_ += bytes;
  stats_->peak_broadcast_buffer_bytes =
      std::max(stats_->peak_broadcast_buffer_bytes, held_ + free_bytes_);
  return OkStatus();
}

void InFlight::ReleaseKept() {
  free_.clear();
  free_bytes_ = 0;
}

Status InFlight::Post(Result<std::unique_ptr<CommRequest>> request, Op op) {
  DCP_ASSIGN_OR_RETURN(op.request, std::move(request));
  ++stats_->broadcasts;
  ops_.push_back(std::move(op));
  return OkStatus();
}

Status InFlight::WaitOldest() {
  Op op = std::move(ops_.front());
  ops_.pop_front();
  held_ -= op.held;
  if (Status s = op.request->Wait(); !s.ok()) {
    // The backend may still write into the staging buffer after a failed wait (MPI
    // cannot cancel a collective): leave it allocated rather than risk a use after free.
    (void)op.staging.data.release();
    return s;
  }
  if (op.done) op.done(op.staging.span());
  Give(std::move(op.staging));
  return OkStatus();
}

Status InFlight::Drain() {
  while (!ops_.empty()) DCP_RETURN_IF_ERROR(WaitOldest());
  return OkStatus();
}

void InFlight::Progress() {
  for (auto& op : ops_) (void)op.request->Test();
}

std::vector<InFlight::Buffer>::iterator InFlight::Reusable(uint64_t bytes) {
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->capacity >= bytes && it->capacity <= 2 * bytes &&
        (best == free_.end() || it->capacity < best->capacity)) {
      best = it;
    }
  }
  return best;
}

void InFlight::Give(Buffer b) {
  if (!b.data || held_ + free_bytes_ + b.capacity > max_held_) return;
  free_bytes_ += b.capacity;
  free_.push_back(std::move(b));
}

}  // namespace dcp::checkpoint
