#include "comm/comm_util.h"

#include <cstring>

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

Result<std::vector<uint64_t>> CheckScatterLists(const std::vector<Comm::Ranges>& to,
                                                const Comm::Ranges& into,
                                                const std::vector<uint64_t>& part_bytes, int root,
                                                int rank, int size) {
  DCP_RETURN_IF_ERROR(CheckRoot("IScatterV", root, size));
  auto bytes_of = [](const Comm::Ranges& ranges) {
    uint64_t n = 0;
    for (std::span<std::byte> r : ranges) n += r.size();
    return n;
  };
  if (part_bytes.size() != static_cast<size_t>(size)) {
    return InvalidArgument("IScatterV: " + std::to_string(part_bytes.size()) +
                           " part sizes for a communicator of " + std::to_string(size));
  }
  if (rank == root && to.size() != static_cast<size_t>(size)) {
    return InvalidArgument("IScatterV: the root has " + std::to_string(to.size()) +
                           " lists of ranges for a communicator of " + std::to_string(size));
  }
  std::vector<uint64_t> offsets(part_bytes.size() + 1, 0);
  for (int m = 0; m < size; ++m) {
    const uint64_t n = m == root ? 0 : part_bytes[m];
    const uint64_t have = rank == root ? (m == root ? 0 : bytes_of(to[m]))
                          : m == rank  ? bytes_of(into)
                                       : n;
    if (have != n) {
      return InvalidArgument("IScatterV: member " + std::to_string(m) + "'s part is " +
                             std::to_string(n) + " bytes, but rank " + std::to_string(rank) +
                             " lists " + std::to_string(have));
    }
    offsets[m + 1] = offsets[m] + n;
  }
  return offsets;
}

void PackParts(const std::vector<Comm::Ranges>& to, const std::vector<uint64_t>& offsets, int root,
               std::byte* packed) {
  for (size_t m = 0; m < to.size(); ++m) {
    if (static_cast<int>(m) == root) continue;
    uint64_t at = offsets[m];
    for (std::span<std::byte> r : to[m]) {
      if (!r.empty()) std::memcpy(packed + at, r.data(), r.size());
      at += r.size();
    }
  }
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
