#include "comm/comm_util.h"

namespace dcp::comm_internal {

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

Status CheckRoot(std::string_view op, int root, int size) {
  if (root >= 0 && root < size) return OkStatus();
  return InvalidArgument(std::string(op) + " root " + std::to_string(root) +
                         " out of range for a communicator of size " + std::to_string(size));
}

Status CheckGatherLists(size_t lists, int size) {
  if (lists == static_cast<size_t>(size)) return OkStatus();
  return InvalidArgument("IAllGatherV: " + std::to_string(lists) +
                         " lists of ranges for a communicator of " + std::to_string(size));
}

Status CheckGroupRanks(const std::vector<int>& ranks, int me, int size) {
  bool has_me = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return InvalidArgument("CreateGroup ranks [" + JoinRanks(ranks) +
                             "] must be sorted, unique and below " + std::to_string(size));
    }
    has_me |= ranks[i] == me;
  }
  if (!has_me) {
    return InvalidArgument("CreateGroup ranks [" + JoinRanks(ranks) +
                           "] must include the calling rank " + std::to_string(me));
  }
  return OkStatus();
}

int IndexOf(const std::vector<int>& ranks, int me) {
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), me) - ranks.begin());
}

Status TimeoutStatus(std::string_view backend, std::string_view op, uint64_t seq,
                     std::chrono::milliseconds timeout, const std::vector<int>& missing, int size,
                     std::string_view detail) {
  std::string msg = std::string(backend) + " " + std::string(op) + " (call #" +
                    std::to_string(seq) + ") timed out after " + std::to_string(timeout.count()) +
                    " ms";
  if (!missing.empty()) {
    msg += ": rank(s) " + JoinRanks(missing) + " of " + std::to_string(size) + " did not arrive";
  }
  if (!detail.empty()) msg += std::string("; ") + std::string(detail);
  return DeadlineExceeded(std::move(msg));
}

namespace {

class CompletedRequestImpl final : public CommRequest {
 public:
  explicit CompletedRequestImpl(Status s) : status_(std::move(s)) {}
  Status Wait() override { return status_; }
  Result<bool> Test() override {
    if (!status_.ok()) return status_;
    return true;
  }

 private:
  Status status_;
};

}  // namespace

std::unique_ptr<CommRequest> CompletedRequest(Status status) {
  return std::make_unique<CompletedRequestImpl>(std::move(status));
}

}  // namespace dcp::comm_internal
