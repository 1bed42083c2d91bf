// The MPI backend's communicator and the state of the operations it polls. mpi_comm.cc holds
// the collectives on dcp's own buffers, groups and the diagnosis after a timeout;
// mpi_in_place.cc the collectives straight between the caller's memory (IBroadcast,
// IAllGatherV, IScatterV).
#pragma once

#if defined(DCP_WITH_MPI)

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comm/comm_util.h"
#include "comm/mpi/mpi_comm_internal.h"
#include "dcp/comm.h"

namespace dcp::mpi_internal {

using comm_internal::Clock;

// Point-to-point tags on dcp's own duplicate communicator (never the caller's).
constexpr int kGatherTag = 7301;       // Gather of more than 2 GiB in total
constexpr int kGroupHelloTag = 7302;   // CreateGroup: member -> first member
constexpr int kGroupGoTag = 7303;      // CreateGroup: first member -> members
constexpr int kCreateGroupTag = 7304;  // MPI_Comm_create_group
constexpr int kPingTag = 7305;         // after a timeout: "I am stuck in call #N; are you?"
constexpr int kPongTag = 7306;         // the answer: the call this rank is waiting in

Status MpiError(std::string_view op, int rc);

// The buffers and requests of one operation. Owned by the operation while it runs; handed to
// the communicator if it times out, because MPI may still write into the buffers.
struct OpState {
  std::vector<MPI_Request> reqs;
  uint64_t data_bytes = 0;  // of the caller's memory it moves (IBroadcast, IAllGatherV, IScatterV)
  uint64_t my_size = 0;
  std::vector<uint64_t> sizes;
  std::string send;
  std::string recv;
  std::vector<int> counts;
  std::vector<int> displs;
  std::vector<int> tokens;
  // IAllGatherV, IScatterV: per-peer datatypes over the caller's ranges, freed once the
  // operation is.
  std::vector<MPI_Datatype> types;
  std::vector<MPI_Datatype> send_types, recv_types;
  std::vector<int> recv_counts;

  OpState() = default;
  OpState(const OpState&) = delete;
  OpState& operator=(const OpState&) = delete;
  ~OpState() {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Datatype& t : types) MPI_Type_free(&t);
  }
};

// Operations MPI may still touch (timed out or failed), process-wide: their buffers live until
// exit, and at exit MPI is finalized only if every one of them has completed since; otherwise
// MPI_Finalize could wait forever for a peer that never comes, so the job is aborted instead.
class Abandoned {
 public:
  static Abandoned& Get() {
    static auto* a = new Abandoned;  // never destroyed: used from the at-exit handler
    return *a;
  }
  void Add(std::shared_ptr<OpState> st) {
    std::lock_guard lock(mu_);
    ops_.push_back(std::move(st));
  }
  // True when every abandoned operation has completed (progressing MPI for up to `wait`).
  bool Settle(std::chrono::milliseconds wait) {
    std::lock_guard lock(mu_);
    const auto deadline = Clock::now() + wait;
    while (true) {
      bool all = true;
      for (auto& st : ops_) {
        int flag = 1;
        if (!st->reqs.empty()) {
          MPI_Testall(static_cast<int>(st->reqs.size()), st->reqs.data(), &flag,
                      MPI_STATUSES_IGNORE);
        }
        all &= flag != 0;
      }
      if (all || Clock::now() >= deadline) return all;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<OpState>> ops_;
};

// Broadcasts in flight into memory the caller owns (IBroadcast). If a communicator fails while
// any is in flight, MPI may write into that memory after the failing call returned and the
// caller freed it; MPI cannot cancel a collective, so the process aborts the job instead.
inline std::atomic<int> g_caller_buffers_in_flight{0};

// Prints `why` and aborts the whole job (MPI_Abort).
[[noreturn]] void AbortJob(const std::string& why);

// Polls MPI in a yield loop for a short while (low latency for small collectives, and fast
// progress: Open MPI progresses messages only inside MPI calls), then with growing sleeps.
// An operation moving `data_bytes` keeps yielding for as long as those bytes may still be
// moving at kSlowLinkBytesPerSecond: a large transfer sleeping between polls advances only at
// each poll (a restore from memory on 4 ranks of 2 cores took 0.7-0.8 s polled with sleeps
// after 20 ms, 0.42-0.59 s polled without them), while waits for a peer that is busy elsewhere
// (most are short of data) still leave the cores to it; at most 0.25 s more, as a wait may
// also be for a root still reading what it sends.
class Poller {
 public:
  static constexpr double kSlowLinkBytesPerSecond = 1e9;
  explicit Poller(uint64_t data_bytes = 0)
      : yield_for_(
            std::chrono::milliseconds(20) +
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                std::min(static_cast<double>(data_bytes) / kSlowLinkBytesPerSecond, 0.25)))) {}
  void Pause(Clock::time_point deadline) {
    if (Clock::now() - start_ < yield_for_) {
      std::this_thread::yield();
    } else {
      backoff_.Sleep(deadline);
    }
  }

 private:
  Clock::duration yield_for_;
  Clock::time_point start_ = Clock::now();
  comm_internal::Backoff backoff_{std::chrono::microseconds(50), std::chrono::microseconds(500)};
};

class MpiCommImpl final : public Comm, public std::enable_shared_from_this<MpiCommImpl> {
 public:
  // Takes ownership of `comm`, which already returns errors (MPI_ERRORS_RETURN).
  MpiCommImpl(MPI_Comm comm, MpiLimits limits);

  ~MpiCommImpl() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  Status CheckConcurrentUse() const override;

  Result<std::vector<std::string>> AllGather(std::string_view mine) override;

  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override;

  Status Broadcast(std::string& data, int root) override;

  Status Barrier() override;

  Result<std::unique_ptr<CommRequest>> IBroadcast(std::span<std::byte> buf, int root) override;
  Result<std::unique_ptr<CommRequest>> IAllGatherV(const Ranges& mine,
                                                   const std::vector<Ranges>& from) override;
  bool gathers_in_place() const override { return true; }
  Result<std::unique_ptr<CommRequest>> IScatterV(const std::vector<Ranges>& to, const Ranges& into,
                                                 const std::vector<uint64_t>& part_bytes,
                                                 int root) override;
  bool scatters_parts() const override { return true; }

  Result<std::shared_ptr<Comm>> CreateGroup(const std::vector<int>& ranks) override;

  // Polls `st->reqs` until all completed or `deadline` passed. On a timeout or error the
  // communicator becomes unusable and keeps `st` alive.
  Status Complete(std::string_view op, const std::shared_ptr<OpState>& st,
                  Clock::time_point deadline);

  // Non-blocking check of `st->reqs`.
  Result<bool> Poll(std::string_view op, const std::shared_ptr<OpState>& st);

 private:
  Result<MPI_Datatype> RangesType(std::string_view op, OpState& st, const Ranges& ranges) const;
  Result<std::unique_ptr<CommRequest>> PostAllToAllW(std::string_view op,
                                                     const std::shared_ptr<OpState>& st);

  Status CheckUsable(std::string_view op) const;

  // Marks the communicator unusable because of `why`, keeping the operation's buffers.
  Status Break(const std::shared_ptr<OpState>& st, Status why);

  // Answers other ranks' pings (sent after their timeout) with the call this rank waits in,
  // and remembers who pinged: a rank that pings is stuck in a call too.
  void AnswerPings();

  // After a timeout of call #calls_: asks every other rank which call it waits in, for a short
  // grace period, and names those that did not answer or wait elsewhere. A rank answers only
  // while it polls inside a call on this communicator, so a stopped rank, or one busy outside
  // dcp, stays silent.
  Status Diagnose(std::string_view op);

  // "; in MPI_COMM_WORLD: rank(s) ..." when this communicator is a subset of the world.
  std::string WorldRankNote(const std::vector<int>& ranks) const;

  // Records request `rc` just posted into `st`.
  Status Posted(std::string_view op, const std::shared_ptr<OpState>& st, int rc);

  // Posts the broadcast of `n` bytes at `p` from `root`, in chunks whose counts fit an int.
  Status PostBroadcast(std::string_view op, const std::shared_ptr<OpState>& st, char* p, uint64_t n,
                       int root);

  // All-gathers the contribution sizes into st->sizes; returns the prefix sums (size_ + 1).
  Result<std::vector<uint64_t>> ExchangeSizes(std::string_view op,
                                              const std::shared_ptr<OpState>& st,
                                              Clock::time_point deadline);

  static void FillCounts(OpState* st, const std::vector<uint64_t>& offsets);

  static std::vector<std::string> Split(const std::string& all,
                                        const std::vector<uint64_t>& offsets);

  // The members of a new group meet before MPI_Comm_create_group, with a timeout.
  Status Rendezvous(const std::vector<int>& ranks);

  // Completes point-to-point requests; at the deadline cancels those still pending and
  // returns false.
  Result<bool> AwaitPointToPoint(const std::shared_ptr<OpState>& st, Clock::time_point deadline);

  MPI_Comm comm_;
  const MpiLimits limits_;
  int rank_ = 0;
  int size_ = 1;
  uint64_t calls_ = 0;  // for messages
  std::string broken_;  // why the communicator is unusable; empty while it is usable
  // rank -> (the call it pinged us from, our call then): only pings heard during the call
  // being diagnosed count.
  std::map<int, std::pair<uint64_t, uint64_t>> heard_;
  std::vector<std::shared_ptr<OpState>> pongs_;  // answers being sent
};

}  // namespace dcp::mpi_internal

#endif  // DCP_WITH_MPI
