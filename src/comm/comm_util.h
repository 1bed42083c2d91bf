// Helpers shared by the comm backends: argument checks, error texts, a completed request,
// and the polling back-off.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dcp/comm.h"

namespace dcp::comm_internal {

using Clock = std::chrono::steady_clock;

// "1, 3" for error messages.
std::string JoinRanks(const std::vector<int>& ranks);

// InvalidArgument unless 0 <= root < size.
Status CheckRoot(std::string_view op, int root, int size);

// InvalidArgument unless an IAllGatherV has one list of ranges per rank.
Status CheckGatherLists(size_t lists, int size);

// InvalidArgument unless an IScatterV's lists fit a communicator of `size` with this `root`:
// one part size per member, one list of ranges per member at the root, and ranges of the
// member's part size. Returns the bytes before each part in the packed order (size + 1).
Result<std::vector<uint64_t>> CheckScatterLists(const std::vector<Comm::Ranges>& to,
                                                const Comm::Ranges& into,
                                                const std::vector<uint64_t>& part_bytes, int root,
                                                int rank, int size);

// The root of an IScatterV packs every other member's part at its offset (CheckScatterLists)
// into `packed`.
void PackParts(const std::vector<Comm::Ranges>& to, const std::vector<uint64_t>& offsets, int root,
               std::byte* packed);

// InvalidArgument unless `ranks` is sorted, unique, within [0, size) and contains `me`.
Status CheckGroupRanks(const std::vector<int>& ranks, int me, int size);

// The position of `me` in the (checked) member list.
int IndexOf(const std::vector<int>& ranks, int me);

// "{backend} {op} (call #{seq}) timed out after {t} ms: rank(s) {missing} of {size} did not
// arrive".
Status TimeoutStatus(std::string_view backend, std::string_view op, uint64_t seq,
                     std::chrono::milliseconds timeout, const std::vector<int>& missing, int size,
                     std::string_view detail = {});

// A request that has already finished with `status`.
std::unique_ptr<CommRequest> CompletedRequest(Status status);

// Sleeps between polls, growing geometrically from `first` to `max`.
class Backoff {
 public:
  Backoff(std::chrono::microseconds first, std::chrono::microseconds max)
      : next_(first), max_(max) {}
  // Sleeps, but never past `deadline`.
  void Sleep(Clock::time_point deadline) {
    auto now = Clock::now();
    if (now >= deadline) return;
    auto d = std::min<Clock::duration>(next_, deadline - now);
    std::this_thread::sleep_for(d);
    next_ = std::min(next_ * 2, max_);
  }

 private:
  std::chrono::microseconds next_;
  std::chrono::microseconds max_;
};

}  // namespace dcp::comm_internal
