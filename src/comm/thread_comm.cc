// Ranks as threads of one process, for tests.
//
// The members of a communicator share one Group: a mutex, a condition variable and a table of
// in-flight calls keyed by call sequence number, so that consecutive collectives never mix.
// Each rank posts its contribution into the slot of its next sequence number and waits only
// for the contributions it needs (everyone for AllGather/Barrier, everyone at the Gather root,
// the root for Broadcast receivers); one-sided callers return at once, like eager MPI sends.
// A slot is erased when every member has left it.
#include "comm/thread_comm.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "comm/comm_util.h"

namespace dcp {
namespace {

using comm_internal::Clock;
using Payload = std::shared_ptr<const std::string>;

// One collective call, as seen by all members.
struct Slot {
  std::string op;  // the first arrival's operation, to detect mismatched calls
  int root = -1;
  std::string mismatch;       // set when a member called something else at this sequence
  std::vector<Payload> data;  // null until that rank arrived
  int departed = 0;
};

// State shared by the members of one communicator (the world or a group).
struct Group {
  explicit Group(int n) : size(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;      // signalled on every arrival
  std::map<uint64_t, Slot> slots;  // guarded by mu
  // Subgroups being created, keyed by (members, nth creation of that member list); an entry
  // lives until every member picked it up. Guarded by mu.
  struct PendingGroup {
    std::shared_ptr<Group> group;
    size_t joined = 0;
  };
  std::map<std::pair<std::vector<int>, int>, PendingGroup> pending_groups;
};

enum class Need { kNone, kRoot, kAll };

// Waits until the contributions `need` asks for are in slot `seq` (which this rank posted
// to). With `deadline` null it only checks, returning an empty vector when not ready yet.
Result<std::vector<Payload>> AwaitSlot(Group& group, std::string_view op, uint64_t seq, int root,
                                       Need need, const Clock::time_point* deadline,
                                       std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(group.mu);
  Slot& slot = group.slots[seq];  // std::map: stable while others are inserted or erased
  bool timed_out = false;
  while (true) {
    if (!slot.mismatch.empty()) return Internal(slot.mismatch);
    std::vector<int> missing;
    if (need == Need::kRoot && !slot.data[root]) missing.push_back(root);
    if (need == Need::kAll) {
      for (int r = 0; r < group.size; ++r) {
        if (!slot.data[r]) missing.push_back(r);
      }
    }
    if (missing.empty()) return slot.data;
    if (deadline == nullptr) return std::vector<Payload>{};
    if (timed_out) {
      return comm_internal::TimeoutStatus("threads", op, seq, timeout, missing, group.size);
    }
    timed_out = group.cv.wait_until(lock, *deadline) == std::cv_status::timeout;
  }
}

// The caller is done with slot `seq`; the last member to leave erases it.
void DepartSlot(Group& group, uint64_t seq) {
  std::lock_guard<std::mutex> lock(group.mu);
  auto it = group.slots.find(seq);
  if (it != group.slots.end() && ++it->second.departed == group.size) group.slots.erase(it);
}

class ThreadCommImpl final : public Comm {
 public:
  ThreadCommImpl(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string_view backend() const override { return "threads"; }

  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    DCP_ASSIGN_OR_RETURN(auto data, Run("AllGather", -1, Own(mine), Need::kAll));
    std::vector<std::string> out;
    out.reserve(data.size());
    for (const Payload& p : data) out.push_back(*p);
    return out;
  }

  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override {
    DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("Gather", root, size()));
    DCP_ASSIGN_OR_RETURN(auto data,
                         Run("Gather", root, Own(mine), rank_ == root ? Need::kAll : Need::kNone));
    std::vector<std::string> out;
    if (rank_ != root) return out;
    out.reserve(data.size());
    for (const Payload& p : data) out.push_back(*p);
    return out;
  }

  Status Broadcast(std::string& data, int root) override {
    DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("Broadcast", root, size()));
    bool is_root = rank_ == root;
    DCP_ASSIGN_OR_RETURN(auto got, Run("Broadcast", root, is_root ? Own(data) : nullptr,
                                       is_root ? Need::kNone : Need::kRoot));
    if (!is_root) data = *got[root];
    return OkStatus();
  }

  Status Barrier() override { return Run("Barrier", -1, nullptr, Need::kAll).status(); }

  Result<std::unique_ptr<CommRequest>> IBroadcast(std::span<std::byte> buf, int root) override;
  Result<std::unique_ptr<CommRequest>> IScatterV(const std::vector<Ranges>& to, const Ranges& into,
                                                 const std::vector<uint64_t>& part_bytes,
                                                 int root) override;
  bool scatters_parts() const override { return true; }
  // `op` is a literal: requests keep it.
  Result<std::unique_ptr<CommRequest>> PostFromRoot(std::string_view op, int root, Payload mine,
                                                    const Ranges& into, uint64_t skip,
                                                    uint64_t expected);

  Result<std::shared_ptr<Comm>> CreateGroup(const std::vector<int>& ranks) override {
    DCP_RETURN_IF_ERROR(comm_internal::CheckGroupRanks(ranks, rank_, size()));
    int nth = creations_[ranks]++;
    std::shared_ptr<Group> group;
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      auto key = std::make_pair(ranks, nth);
      auto& pending = group_->pending_groups[key];
      if (!pending.group) pending.group = std::make_shared<Group>(static_cast<int>(ranks.size()));
      group = pending.group;
      if (++pending.joined == ranks.size()) group_->pending_groups.erase(key);
    }
    auto comm =
        std::make_shared<ThreadCommImpl>(std::move(group), comm_internal::IndexOf(ranks, rank_));
    comm->set_timeout(timeout());
    return std::shared_ptr<Comm>(std::move(comm));
  }

  // Posts this rank's contribution (null when it has none) to its next call; returns the
  // call's sequence number.
  Result<uint64_t> Post(std::string_view op, int root, Payload mine) {
    uint64_t seq = next_seq_++;
    std::lock_guard<std::mutex> lock(group_->mu);
    Slot& slot = group_->slots[seq];
    if (slot.data.empty()) {
      slot.op = std::string(op);
      slot.root = root;
      slot.data.resize(group_->size);
    } else if (slot.op != op || slot.root != root) {
      slot.mismatch = "collective mismatch at call #" + std::to_string(seq) + ": rank " +
                      std::to_string(rank_) + " called " + std::string(op) + " (root " +
                      std::to_string(root) + "), another rank called " + slot.op + " (root " +
                      std::to_string(slot.root) + ")";
    }
    // Everyone, contributing or not, marks its arrival so Barrier and timeouts can see it.
    slot.data[rank_] = mine ? std::move(mine) : std::make_shared<const std::string>();
    group_->cv.notify_all();
    if (!slot.mismatch.empty()) return Internal(slot.mismatch);
    return seq;
  }

 private:
  static Payload Own(std::string_view s) { return std::make_shared<const std::string>(s); }

  Result<std::vector<Payload>> Run(std::string_view op, int root, Payload mine, Need need) {
    auto seq = Post(op, root, std::move(mine));
    if (!seq.ok()) {
      DepartSlot(*group_, next_seq_ - 1);
      return seq.status();
    }
    Clock::time_point deadline = Clock::now() + timeout();
    auto data = AwaitSlot(*group_, op, *seq, root, need, &deadline, timeout());
    DepartSlot(*group_, *seq);
    return data;
  }

  std::shared_ptr<Group> group_;
  const int rank_;
  uint64_t next_seq_ = 0;
  std::map<std::vector<int>, int> creations_;  // CreateGroup calls per member list
};

// A receiver's pending broadcast, or part of a scatter: bytes [skip, skip + its ranges) of the
// root's `expected` bytes. The root's copy was posted when it started, so the root's request
// is already complete. Holds no lock between calls.
class ThreadBroadcastRequest final : public CommRequest {
 public:
  ThreadBroadcastRequest(std::shared_ptr<Group> group, int rank, std::chrono::milliseconds timeout,
                         uint64_t seq, int root, Comm::Ranges into, uint64_t skip,
                         uint64_t expected, std::string_view op)
      : group_(std::move(group)),
        rank_(rank),
        timeout_(timeout),
        seq_(seq),
        root_(root),
        into_(std::move(into)),
        skip_(skip),
        expected_(expected),
        op_(op) {}
  ~ThreadBroadcastRequest() override {
    if (!done_) DepartSlot(*group_, seq_);
  }

  Status Wait() override {
    if (done_) return status_;
    Clock::time_point deadline = Clock::now() + timeout_;
    return Finish(AwaitSlot(*group_, op_, seq_, root_, Need::kRoot, &deadline, timeout_));
  }

  Result<bool> Test() override {
    if (!done_) {
      auto data = AwaitSlot(*group_, op_, seq_, root_, Need::kRoot, nullptr, timeout_);
      if (data.ok() && data->empty()) return false;
      DCP_RETURN_IF_ERROR(Finish(std::move(data)));
    }
    if (!status_.ok()) return status_;
    return true;
  }

 private:
  Status Finish(Result<std::vector<Payload>> data) {
    // A timeout leaves the request pending (the root may still come); other errors are final.
    if (!data.ok() && data.status().code() == StatusCode::kDeadlineExceeded) {
      return data.status();
    }
    if (!data.ok()) {
      status_ = data.status();
    } else {
      const std::string& src = *(*data)[root_];
      if (src.size() != expected_) {
        status_ = InvalidArgument(std::string(op_) + " buffer sizes differ: root " +
                                  std::to_string(root_) + " sent " + std::to_string(src.size()) +
                                  " bytes, rank " + std::to_string(rank_) + " expects " +
                                  std::to_string(expected_));
      } else {
        uint64_t at = skip_;
        for (std::span<std::byte> r : into_) {
          if (!r.empty()) std::memcpy(r.data(), src.data() + at, r.size());
          at += r.size();
        }
      }
    }
    done_ = true;
    DepartSlot(*group_, seq_);
    return status_;
  }

  std::shared_ptr<Group> group_;
  const int rank_;
  const std::chrono::milliseconds timeout_;
  const uint64_t seq_;
  const int root_;
  const Comm::Ranges into_;
  const uint64_t skip_;
  const uint64_t expected_;
  const std::string_view op_;  // a literal
  bool done_ = false;
  Status status_;
};

Result<std::unique_ptr<CommRequest>> ThreadCommImpl::IBroadcast(std::span<std::byte> buf,
                                                                int root) {
  DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("IBroadcast", root, size()));
  bool is_root = rank_ == root;
  Payload mine;
  if (is_root) {
    mine =
        std::make_shared<const std::string>(reinterpret_cast<const char*>(buf.data()), buf.size());
  }
  return PostFromRoot("IBroadcast", root, std::move(mine), Comm::Ranges{buf}, 0, buf.size());
}

// The root posts all parts packed; each member copies only its own out of the root's copy.
Result<std::unique_ptr<CommRequest>> ThreadCommImpl::IScatterV(
    const std::vector<Ranges>& to, const Ranges& into, const std::vector<uint64_t>& part_bytes,
    int root) {
  DCP_ASSIGN_OR_RETURN(const std::vector<uint64_t> offsets,
                       comm_internal::CheckScatterLists(to, into, part_bytes, root, rank_, size()));
  const bool is_root = rank_ == root;
  Payload mine;
  if (is_root) {
    std::string packed(offsets.back(), '\0');
    comm_internal::PackParts(to, offsets, root, reinterpret_cast<std::byte*>(packed.data()));
    mine = std::make_shared<const std::string>(std::move(packed));
  }
  return PostFromRoot("IScatterV", root, std::move(mine), into, offsets[rank_], offsets.back());
}

// Posts `root`'s payload (null elsewhere) to the next call; the root is done at once, each
// other member gets a request copying bytes [skip, skip + its ranges) of it into `into`.
Result<std::unique_ptr<CommRequest>> ThreadCommImpl::PostFromRoot(std::string_view op, int root,
                                                                  Payload mine, const Ranges& into,
                                                                  uint64_t skip,
                                                                  uint64_t expected) {
  auto seq = Post(op, root, std::move(mine));
  if (!seq.ok()) {
    DepartSlot(*group_, next_seq_ - 1);
    return seq.status();
  }
  if (rank_ == root) {
    DepartSlot(*group_, *seq);
    return comm_internal::CompletedRequest(OkStatus());
  }
  return std::unique_ptr<CommRequest>(std::make_unique<ThreadBroadcastRequest>(
      group_, rank_, timeout(), *seq, root, into, skip, expected, op));
}

}  // namespace

std::vector<std::shared_ptr<Comm>> MakeThreadComms(int n) {
  auto group = std::make_shared<Group>(n);
  std::vector<std::shared_ptr<Comm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_shared<ThreadCommImpl>(group, r));
  return comms;
}

}  // namespace dcp
