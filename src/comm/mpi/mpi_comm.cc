// The MPI backend. Every collective is issued non-blocking and polled with MPI_Test* until it
// completes or the deadline passes, because MPI's blocking collectives cannot time out.
//
// Sizes travel first (uint64), then the bytes in chunks of at most 1 GiB so every MPI count
// fits an int (MpiLimits; tests lower them to cover the chunked paths with small buffers). MPI
// cannot cancel a collective: after a timeout or an MPI error the communicator records why and
// refuses further calls, and the operation's buffers (OpState) stay owned by it, since MPI may
// still touch them.
#if defined(DCP_WITH_MPI)

#include "dcp/mpi_comm.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "comm/comm_util.h"
#include "comm/mpi/mpi_comm_internal.h"

namespace dcp {
namespace {

using comm_internal::Clock;

// Point-to-point tags on dcp's own duplicate communicator (never the caller's).
constexpr int kGatherTag = 7301;       // Gather of more than 2 GiB in total
constexpr int kGroupHelloTag = 7302;   // CreateGroup: member -> first member
constexpr int kGroupGoTag = 7303;      // CreateGroup: first member -> members
constexpr int kCreateGroupTag = 7304;  // MPI_Comm_create_group
constexpr int kPingTag = 7305;         // after a timeout: "I am stuck in call #N; are you?"
constexpr int kPongTag = 7306;         // the answer: the call this rank is waiting in

Status MpiError(std::string_view op, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    len = std::snprintf(text, sizeof(text), "unknown MPI error");
  }
  return Unavailable("mpi " + std::string(op) + ": " + std::string(text, len) + " (code " +
                     std::to_string(rc) + ")");
}

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
std::atomic<int> g_caller_buffers_in_flight{0};

[[noreturn]] void AbortJob(const std::string& why) {
  std::fprintf(stderr, "dcp: %s\n", why.c_str());
  std::fflush(nullptr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

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
  MpiCommImpl(MPI_Comm comm, MpiLimits limits) : comm_(comm), limits_(limits) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  ~MpiCommImpl() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // too late to free anything; MPI released it all
    // Operations still running (MPI may write into their buffers) are in Abandoned already.
    for (auto& p : pongs_) Abandoned::Get().Add(std::move(p));
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  Status CheckConcurrentUse() const override {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level >= MPI_THREAD_MULTIPLE) return OkStatus();
    const char* name = level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                       : level == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED"
                                                      : "MPI_THREAD_SINGLE";
    return FailedPrecondition(
        std::string(
            "async save over MPI needs MPI_THREAD_MULTIPLE, but MPI was initialized with ") +
        name +
        ": initialize it with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or "
        "dcp::EnsureMpiInitialized, or save synchronously");
  }

  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    DCP_RETURN_IF_ERROR(CheckUsable("AllGather"));
    const Clock::time_point deadline = Clock::now() + timeout();
    ++calls_;
    auto st = std::make_shared<OpState>();
    st->send.assign(mine);  // MPI reads it after a timeout too: it must be ours
    DCP_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets, ExchangeSizes("AllGather", st, deadline));
    const uint64_t total = offsets.back();
    st->recv.resize(total);
    st->reqs.resize(1);
    if (total <= limits_.max_count) {
      FillCounts(st.get(), offsets);
      DCP_RETURN_IF_ERROR(
          Posted("AllGather", st,
                 MPI_Iallgatherv(st->send.data(), static_cast<int>(st->send.size()), MPI_BYTE,
                                 st->recv.data(), st->counts.data(), st->displs.data(), MPI_BYTE,
                                 comm_, &st->reqs[0])));
    } else {
      // Counts and displacements would overflow int: one chunked broadcast per rank.
      st->reqs.clear();
      if (!st->send.empty())
        std::memcpy(st->recv.data() + offsets[rank_], st->send.data(), st->send.size());
      for (int r = 0; r < size_; ++r) {
        DCP_RETURN_IF_ERROR(
            PostBroadcast("AllGather", st, st->recv.data() + offsets[r], st->sizes[r], r));
      }
    }
    DCP_RETURN_IF_ERROR(Complete("AllGather", st, deadline));
    return Split(st->recv, offsets);
  }

  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override {
    DCP_RETURN_IF_ERROR(CheckUsable("Gather"));
    DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("Gather", root, size_));
    const Clock::time_point deadline = Clock::now() + timeout();
    ++calls_;
    auto st = std::make_shared<OpState>();
    st->send.assign(mine);
    // Every rank learns all sizes, so all take the same path below.
    DCP_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets, ExchangeSizes("Gather", st, deadline));
    const uint64_t total = offsets.back();
    const bool is_root = rank_ == root;
    if (is_root) st->recv.resize(total);
    if (total <= limits_.max_count) {
      FillCounts(st.get(), offsets);
      st->reqs.resize(1);
      DCP_RETURN_IF_ERROR(
          Posted("Gather", st,
                 MPI_Igatherv(st->send.data(), static_cast<int>(st->send.size()), MPI_BYTE,
                              st->recv.data(), st->counts.data(), st->displs.data(), MPI_BYTE, root,
                              comm_, &st->reqs[0])));
    } else if (is_root) {
      if (!st->send.empty())
        std::memcpy(st->recv.data() + offsets[rank_], st->send.data(), st->send.size());
      for (int r = 0; r < size_; ++r) {
        if (r == root) continue;
        for (uint64_t off = 0; off < st->sizes[r]; off += limits_.chunk) {
          int count = static_cast<int>(std::min<uint64_t>(limits_.chunk, st->sizes[r] - off));
          st->reqs.emplace_back();
          DCP_RETURN_IF_ERROR(Posted("Gather", st,
                                     MPI_Irecv(st->recv.data() + offsets[r] + off, count, MPI_BYTE,
                                               r, kGatherTag, comm_, &st->reqs.back())));
        }
      }
    } else {
      for (uint64_t off = 0; off < st->send.size(); off += limits_.chunk) {
        int count = static_cast<int>(std::min<uint64_t>(limits_.chunk, st->send.size() - off));
        st->reqs.emplace_back();
        DCP_RETURN_IF_ERROR(Posted("Gather", st,
                                   MPI_Isend(st->send.data() + off, count, MPI_BYTE, root,
                                             kGatherTag, comm_, &st->reqs.back())));
      }
    }
    DCP_RETURN_IF_ERROR(Complete("Gather", st, deadline));
    if (!is_root) return std::vector<std::string>{};
    return Split(st->recv, offsets);
  }

  Status Broadcast(std::string& data, int root) override {
    DCP_RETURN_IF_ERROR(CheckUsable("Broadcast"));
    DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("Broadcast", root, size_));
    const Clock::time_point deadline = Clock::now() + timeout();
    ++calls_;
    const bool is_root = rank_ == root;
    auto st = std::make_shared<OpState>();
    st->my_size = is_root ? data.size() : 0;
    st->reqs.resize(1);
    DCP_RETURN_IF_ERROR(Posted(
        "Broadcast", st, MPI_Ibcast(&st->my_size, 1, MPI_UINT64_T, root, comm_, &st->reqs[0])));
    DCP_RETURN_IF_ERROR(Complete("Broadcast", st, deadline));
    // The root lends its string to the operation instead of copying it.
    if (is_root) {
      st->recv = std::move(data);
    } else {
      st->recv.resize(st->my_size);
    }
    Status s = PostBroadcast("Broadcast", st, st->recv.data(), st->recv.size(), root);
    if (s.ok()) s = Complete("Broadcast", st, deadline);
    if (s.ok() || !is_root) {
      if (s.ok()) data = std::move(st->recv);
      return s;
    }
    data = st->recv;  // MPI may still read st->recv: give the root a copy back
    return s;
  }

  Status Barrier() override {
    DCP_RETURN_IF_ERROR(CheckUsable("Barrier"));
    const Clock::time_point deadline = Clock::now() + timeout();
    ++calls_;
    auto st = std::make_shared<OpState>();
    st->reqs.resize(1);
    DCP_RETURN_IF_ERROR(Posted("Barrier", st, MPI_Ibarrier(comm_, &st->reqs[0])));
    return Complete("Barrier", st, deadline);
  }

  Result<std::unique_ptr<CommRequest>> IBroadcast(std::span<std::byte> buf, int root) override;
  Result<std::unique_ptr<CommRequest>> IAllGatherV(const Ranges& mine,
                                                   const std::vector<Ranges>& from) override;
  bool gathers_in_place() const override { return true; }
  Result<std::unique_ptr<CommRequest>> IScatterV(const std::vector<Ranges>& to, const Ranges& into,
                                                 const std::vector<uint64_t>& part_bytes,
                                                 int root) override;
  bool scatters_parts() const override { return true; }

  Result<std::shared_ptr<Comm>> CreateGroup(const std::vector<int>& ranks) override {
    DCP_RETURN_IF_ERROR(CheckUsable("CreateGroup"));
    DCP_RETURN_IF_ERROR(comm_internal::CheckGroupRanks(ranks, rank_, size_));
    // Not counted in calls_: only the members call it, and calls_ must count alike on every
    // rank for Diagnose to compare it. MPI_Comm_create_group blocks until every member calls it and
    // cannot time out, so the members first meet with cancellable point-to-point messages: the
    // first member hears from all others, then tells them to go.
    DCP_RETURN_IF_ERROR(Rendezvous(ranks));
    MPI_Group parent_group, sub_group;
    MPI_Comm sub = MPI_COMM_NULL;
    int rc = MPI_Comm_group(comm_, &parent_group);
    if (rc != MPI_SUCCESS) return MpiError("CreateGroup (MPI_Comm_group)", rc);
    rc = MPI_Group_incl(parent_group, static_cast<int>(ranks.size()), ranks.data(), &sub_group);
    MPI_Group_free(&parent_group);
    if (rc != MPI_SUCCESS) return MpiError("CreateGroup (MPI_Group_incl)", rc);
    rc = MPI_Comm_create_group(comm_, sub_group, kCreateGroupTag, &sub);
    MPI_Group_free(&sub_group);
    if (rc != MPI_SUCCESS) return MpiError("CreateGroup (MPI_Comm_create_group)", rc);
    MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    auto comm = std::make_shared<MpiCommImpl>(sub, limits_);
    comm->set_timeout(timeout());
    return std::shared_ptr<Comm>(std::move(comm));
  }

  // Polls `st->reqs` until all completed or `deadline` passed. On a timeout or error the
  // communicator becomes unusable and keeps `st` alive.
  Status Complete(std::string_view op, const std::shared_ptr<OpState>& st,
                  Clock::time_point deadline) {
    // Every call checked usability before posting; a break since then with this operation in
    // flight (a caller-memory broadcast) aborted the job.
    DCP_RETURN_IF_ERROR(CheckUsable(op));
    Poller poller(st->data_bytes);
    auto next_answer = Clock::now();
    while (true) {
      int done = 0;
      int rc = MPI_Testall(static_cast<int>(st->reqs.size()), st->reqs.data(), &done,
                           MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) return Break(st, MpiError(op, rc));
      if (done) {
        st->reqs.clear();
        return OkStatus();
      }
      const auto now = Clock::now();
      // Pings come only after another rank timed out (seconds at least): answering them
      // once a millisecond keeps the probe off the low-latency spin.
      if (now >= next_answer) {
        AnswerPings();
        next_answer = now + std::chrono::milliseconds(1);
      }
      if (now >= deadline) return Break(st, Diagnose(op));
      poller.Pause(deadline);
    }
  }

  // Non-blocking check of `st->reqs`.
  Result<bool> Poll(std::string_view op, const std::shared_ptr<OpState>& st) {
    int done = 0;
    int rc =
        MPI_Testall(static_cast<int>(st->reqs.size()), st->reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return Break(st, MpiError(op, rc));
    if (done) st->reqs.clear();
    return done != 0;
  }

 private:
  Result<MPI_Datatype> RangesType(std::string_view op, OpState& st, const Ranges& ranges) const;
  Result<std::unique_ptr<CommRequest>> PostAllToAllW(std::string_view op,
                                                     const std::shared_ptr<OpState>& st);

  Status CheckUsable(std::string_view op) const {
    if (broken_.empty()) return OkStatus();
    return FailedPrecondition("mpi " + std::string(op) +
                              ": communicator unusable after an earlier failure: " + broken_);
  }

  // Marks the communicator unusable because of `why`, keeping the operation's buffers.
  Status Break(const std::shared_ptr<OpState>& st, Status why) {
    if (broken_.empty()) broken_ = why.message();
    Abandoned::Get().Add(st);
    if (g_caller_buffers_in_flight.load() > 0) {
      AbortJob(why.message() +
               "; a broadcast into the caller's memory is still in flight and MPI cannot cancel "
               "it, so the job is aborted rather than let MPI write into freed memory");
    }
    return why;
  }

  // Answers other ranks' pings (sent after their timeout) with the call this rank waits in,
  // and remembers who pinged: a rank that pings is stuck in a call too.
  void AnswerPings() {
    while (true) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, comm_, &flag, &status) != MPI_SUCCESS || !flag) {
        break;
      }
      uint64_t their_call = 0;
      MPI_Recv(&their_call, 1, MPI_UINT64_T, status.MPI_SOURCE, kPingTag, comm_, MPI_STATUS_IGNORE);
      heard_[status.MPI_SOURCE] = {their_call, calls_};
      auto pong = std::make_shared<OpState>();
      pong->my_size = calls_;
      pong->reqs.resize(1);
      if (MPI_Isend(&pong->my_size, 1, MPI_UINT64_T, status.MPI_SOURCE, kPongTag, comm_,
                    &pong->reqs[0]) == MPI_SUCCESS) {
        pongs_.push_back(std::move(pong));
      }
    }
    std::erase_if(pongs_, [](const std::shared_ptr<OpState>& p) {
      int done = 0;
      MPI_Testall(static_cast<int>(p->reqs.size()), p->reqs.data(), &done, MPI_STATUSES_IGNORE);
      return done != 0;
    });
  }

  // After a timeout of call #calls_: asks every other rank which call it waits in, for a short
  // grace period, and names those that did not answer or wait elsewhere. A rank answers only
  // while it polls inside a call on this communicator, so a stopped rank, or one busy outside
  // dcp, stays silent.
  Status Diagnose(std::string_view op) {
    const auto grace = std::min(timeout(), std::clamp<std::chrono::milliseconds>(
                                               timeout() / 5, std::chrono::milliseconds(1000),
                                               std::chrono::milliseconds(10000)));
    auto st = std::make_shared<OpState>();
    st->my_size = calls_;
    st->sizes.assign(size_, 0);
    std::vector<MPI_Request> recvs(size_, MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Irecv(&st->sizes[r], 1, MPI_UINT64_T, r, kPongTag, comm_, &recvs[r]);
      st->reqs.emplace_back();
      MPI_Isend(&st->my_size, 1, MPI_UINT64_T, r, kPingTag, comm_, &st->reqs.back());
    }
    std::vector<bool> answered(size_, false);
    answered[rank_] = true;
    const auto deadline = Clock::now() + grace;
    comm_internal::Backoff backoff{std::chrono::microseconds(50), std::chrono::microseconds(500)};
    while (true) {
      AnswerPings();
      bool all = true;
      for (int r = 0; r < size_; ++r) {
        if (answered[r]) continue;
        int flag = 0;
        MPI_Test(&recvs[r], &flag, MPI_STATUS_IGNORE);
        if (flag) {
          answered[r] = true;
        } else if (auto it = heard_.find(r); it != heard_.end() && it->second.second == calls_) {
          // It pinged us during this call: it is stuck in a call as well.
          answered[r] = true;
          st->sizes[r] = it->second.first;
        }
        all &= answered[r];
      }
      if (all || Clock::now() >= deadline) break;
      backoff.Sleep(deadline);
    }
    for (MPI_Request& req : recvs) {
      if (req != MPI_REQUEST_NULL) {
        MPI_Cancel(&req);
        st->reqs.push_back(req);  // completes once cancelled; its buffer stays alive
      }
    }
    Abandoned::Get().Add(st);
    std::vector<int> missing;
    std::string elsewhere;
    for (int r = 0; r < size_; ++r) {
      if (!answered[r]) {
        missing.push_back(r);
      } else if (r != rank_ && st->sizes[r] != calls_) {
        elsewhere += (elsewhere.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) +
                     " waits in call #" + std::to_string(st->sizes[r]);
      }
    }
    std::string detail = "timed out on rank " + std::to_string(rank_);
    if (missing.empty() && elsewhere.empty()) {
      detail += "; every rank answered that it waits in this call, yet it did not complete";
    } else if (missing.empty()) {
      detail += "; no rank is missing, but " + elsewhere;
    } else {
      detail += " (no answer from the missing ranks: stopped, dead, or busy outside dcp)";
      if (!elsewhere.empty()) detail += "; " + elsewhere;
    }
    detail += WorldRankNote(missing);
    detail += "; MPI cannot cancel a collective, so this communicator is no longer usable";
    return comm_internal::TimeoutStatus("mpi", op, calls_, timeout(), missing, size_, detail);
  }

  // "; in MPI_COMM_WORLD: rank(s) ..." when this communicator is a subset of the world.
  std::string WorldRankNote(const std::vector<int>& ranks) const {
    int world_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (ranks.empty() || world_size == size_) return {};
    MPI_Group mine, world;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> out(ranks.size(), MPI_UNDEFINED);
    MPI_Group_translate_ranks(mine, static_cast<int>(ranks.size()), ranks.data(), world,
                              out.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    return "; in MPI_COMM_WORLD: rank(s) " + comm_internal::JoinRanks(out);
  }

  // Records request `rc` just posted into `st`.
  Status Posted(std::string_view op, const std::shared_ptr<OpState>& st, int rc) {
    if (rc == MPI_SUCCESS) return OkStatus();
    st->reqs.pop_back();  // not a valid request
    return Break(st, MpiError(op, rc));
  }

  // Posts the broadcast of `n` bytes at `p` from `root`, in chunks whose counts fit an int.
  Status PostBroadcast(std::string_view op, const std::shared_ptr<OpState>& st, char* p, uint64_t n,
                       int root) {
    for (uint64_t off = 0; off < n; off += limits_.chunk) {
      int count = static_cast<int>(std::min<uint64_t>(limits_.chunk, n - off));
      st->reqs.emplace_back();
      DCP_RETURN_IF_ERROR(
          Posted(op, st, MPI_Ibcast(p + off, count, MPI_BYTE, root, comm_, &st->reqs.back())));
    }
    return OkStatus();
  }

  // All-gathers the contribution sizes into st->sizes; returns the prefix sums (size_ + 1).
  Result<std::vector<uint64_t>> ExchangeSizes(std::string_view op,
                                              const std::shared_ptr<OpState>& st,
                                              Clock::time_point deadline) {
    st->my_size = st->send.size();
    st->sizes.assign(size_, 0);
    st->reqs.resize(1);
    DCP_RETURN_IF_ERROR(Posted(op, st,
                               MPI_Iallgather(&st->my_size, 1, MPI_UINT64_T, st->sizes.data(), 1,
                                              MPI_UINT64_T, comm_, &st->reqs[0])));
    DCP_RETURN_IF_ERROR(Complete(op, st, deadline));
    std::vector<uint64_t> offsets(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) offsets[r + 1] = offsets[r] + st->sizes[r];
    return offsets;
  }

  static void FillCounts(OpState* st, const std::vector<uint64_t>& offsets) {
    st->counts.resize(st->sizes.size());
    st->displs.resize(st->sizes.size());
    for (size_t r = 0; r < st->sizes.size(); ++r) {
      st->counts[r] = static_cast<int>(st->sizes[r]);
      st->displs[r] = static_cast<int>(offsets[r]);
    }
  }

  static std::vector<std::string> Split(const std::string& all,
                                        const std::vector<uint64_t>& offsets) {
    std::vector<std::string> out(offsets.size() - 1);
    for (size_t r = 0; r + 1 < offsets.size(); ++r) {
      out[r] = all.substr(offsets[r], offsets[r + 1] - offsets[r]);
    }
    return out;
  }

  // The members of a new group meet before MPI_Comm_create_group, with a timeout.
  Status Rendezvous(const std::vector<int>& ranks) {
    const Clock::time_point deadline = Clock::now() + timeout();
    const int leader = ranks.front();
    auto st = std::make_shared<OpState>();
    st->tokens.assign(ranks.size(), 0);
    if (rank_ == leader) {
      for (size_t i = 1; i < ranks.size(); ++i) {
        st->reqs.emplace_back();
        DCP_RETURN_IF_ERROR(Posted("CreateGroup", st,
                                   MPI_Irecv(&st->tokens[i], 1, MPI_INT, ranks[i], kGroupHelloTag,
                                             comm_, &st->reqs.back())));
      }
      DCP_ASSIGN_OR_RETURN(bool arrived, AwaitPointToPoint(st, deadline));
      if (!arrived) {
        std::vector<int> missing;
        for (size_t i = 1; i < ranks.size(); ++i) {
          if (st->tokens[i] != 1) missing.push_back(ranks[i]);
        }
        // Late messages could match later calls: the communicator is done for.
        return Break(st, comm_internal::TimeoutStatus(
                             "mpi", "CreateGroup [" + comm_internal::JoinRanks(ranks) + "]", calls_,
                             timeout(), missing, size_, "this communicator is no longer usable"));
      }
      st->reqs.clear();
      st->tokens[0] = 1;
      for (size_t i = 1; i < ranks.size(); ++i) {
        st->reqs.emplace_back();
        DCP_RETURN_IF_ERROR(Posted(
            "CreateGroup", st,
            MPI_Isend(&st->tokens[0], 1, MPI_INT, ranks[i], kGroupGoTag, comm_, &st->reqs.back())));
      }
      return Complete("CreateGroup", st, deadline);
    }
    st->tokens[0] = 1;
    st->reqs.resize(2);
    DCP_RETURN_IF_ERROR(
        Posted("CreateGroup", st,
               MPI_Isend(&st->tokens[0], 1, MPI_INT, leader, kGroupHelloTag, comm_, &st->reqs[0])));
    DCP_RETURN_IF_ERROR(
        Posted("CreateGroup", st,
               MPI_Irecv(&st->tokens[1], 1, MPI_INT, leader, kGroupGoTag, comm_, &st->reqs[1])));
    DCP_ASSIGN_OR_RETURN(bool arrived, AwaitPointToPoint(st, deadline));
    if (!arrived) {
      return Break(st, comm_internal::TimeoutStatus(
                           "mpi", "CreateGroup [" + comm_internal::JoinRanks(ranks) + "]", calls_,
                           timeout(), {}, size_,
                           "the first member, rank " + std::to_string(leader) +
                               ", did not confirm that every member arrived; this "
                               "communicator is no longer usable"));
    }
    return OkStatus();
  }

  // Completes point-to-point requests; at the deadline cancels those still pending and
  // returns false.
  Result<bool> AwaitPointToPoint(const std::shared_ptr<OpState>& st, Clock::time_point deadline) {
    Poller poller;
    while (true) {
      int done = 0;
      int rc = MPI_Testall(static_cast<int>(st->reqs.size()), st->reqs.data(), &done,
                           MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) return Break(st, MpiError("CreateGroup", rc));
      if (done) return true;
      if (Clock::now() >= deadline) break;
      poller.Pause(deadline);
    }
    for (MPI_Request& req : st->reqs) {
      if (req != MPI_REQUEST_NULL) MPI_Cancel(&req);
    }
    return false;
  }

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

// A broadcast or all-gather in flight, into the caller's memory. Destroying it unfinished waits for
// it (bounded by the timeout): MPI offers no way to abandon a collective whose buffer is about to
// go away. While it is in flight it counts in g_caller_buffers_in_flight, so that a failure of
// any communicator aborts the job rather than return while MPI may still write into it.
class MpiBroadcastRequest final : public CommRequest {
 public:
  MpiBroadcastRequest(std::shared_ptr<MpiCommImpl> comm, std::shared_ptr<OpState> st,
                      std::string_view op = "IBroadcast")
      : comm_(std::move(comm)), st_(std::move(st)), op_(op) {}
  ~MpiBroadcastRequest() override {
    if (!finished_) (void)Wait();
  }

  Status Wait() override {
    if (!finished_) {
      status_ = comm_->Complete(op_, st_, Clock::now() + comm_->timeout());
      Finish();
    }
    return status_;
  }

  Result<bool> Test() override {
    if (finished_) {
      if (!status_.ok()) return status_;
      return true;
    }
    auto done = comm_->Poll(op_, st_);
    if (!done.ok()) {
      status_ = done.status();
      Finish();
      return status_;
    }
    if (*done) Finish();
    return *done;
  }

 private:
  void Finish() {
    finished_ = true;
    g_caller_buffers_in_flight.fetch_sub(1);
  }

  std::shared_ptr<MpiCommImpl> comm_;  // outlives the operation
  std::shared_ptr<OpState> st_;
  std::string_view op_;  // a literal
  bool finished_ = false;
  Status status_;
};

Result<std::unique_ptr<CommRequest>> MpiCommImpl::IBroadcast(std::span<std::byte> buf, int root) {
  DCP_RETURN_IF_ERROR(CheckUsable("IBroadcast"));
  DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("IBroadcast", root, size_));
  ++calls_;
  auto st = std::make_shared<OpState>();
  st->data_bytes = buf.size();
  // Counted before posting: a failure while posting some chunks must not return with others in
  // flight, so it aborts the job (Break) instead.
  auto req = std::make_unique<MpiBroadcastRequest>(shared_from_this(), st);
  g_caller_buffers_in_flight.fetch_add(1);
  // The caller's buffer, which it keeps alive until Wait(): no copy of tensor data.
  DCP_RETURN_IF_ERROR(
      PostBroadcast("IBroadcast", st, reinterpret_cast<char*>(buf.data()), buf.size(), root));
  return std::unique_ptr<CommRequest>(std::move(req));
}

// One hindexed datatype over `ranges`, at absolute addresses (MPI_BOTTOM), in blocks whose
// lengths fit an int, kept in `st` until the operation is freed; null for no bytes.
Result<MPI_Datatype> MpiCommImpl::RangesType(std::string_view op, OpState& st,
                                             const Ranges& ranges) const {
  std::vector<int> lengths;
  std::vector<MPI_Aint> addresses;
  for (std::span<std::byte> r : ranges) {
    for (uint64_t off = 0; off < r.size(); off += limits_.chunk) {
      MPI_Aint a = 0;
      MPI_Get_address(r.data() + off, &a);
      addresses.push_back(a);
      lengths.push_back(static_cast<int>(std::min<uint64_t>(limits_.chunk, r.size() - off)));
    }
  }
  if (lengths.empty()) return MPI_DATATYPE_NULL;
  MPI_Datatype t = MPI_DATATYPE_NULL;
  int rc = MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(),
                                    addresses.data(), MPI_BYTE, &t);
  if (rc != MPI_SUCCESS) return MpiError(std::string(op) + " (MPI_Type_create_hindexed)", rc);
  st.types.push_back(t);
  rc = MPI_Type_commit(&st.types.back());
  if (rc != MPI_SUCCESS) return MpiError(std::string(op) + " (MPI_Type_commit)", rc);
  return st.types.back();
}

// Posts one MPI_Ialltoallw between the caller's ranges: to peer r st->send_types[r] (where
// st->counts[r] is 1), from it st->recv_types[r] (where st->recv_counts[r] is 1).
Result<std::unique_ptr<CommRequest>> MpiCommImpl::PostAllToAllW(
    std::string_view op, const std::shared_ptr<OpState>& st) {
  st->displs.assign(size_, 0);  // the datatypes hold absolute addresses
  // A call from here on (a failure before posted nothing, and peers time out naming this rank).
  ++calls_;
  // Counted before posting, as IBroadcast: MPI moves the bytes straight between the caller's
  // ranges, which must not be freed while it may still write into them.
  auto req = std::make_unique<MpiBroadcastRequest>(shared_from_this(), st, op);
  g_caller_buffers_in_flight.fetch_add(1);
  st->reqs.emplace_back();
  DCP_RETURN_IF_ERROR(
      Posted(op, st,
             MPI_Ialltoallw(MPI_BOTTOM, st->counts.data(), st->displs.data(), st->send_types.data(),
                            MPI_BOTTOM, st->recv_counts.data(), st->displs.data(),
                            st->recv_types.data(), comm_, &st->reqs.back())));
  return std::unique_ptr<CommRequest>(std::move(req));
}

Result<std::unique_ptr<CommRequest>> MpiCommImpl::IAllGatherV(const Ranges& mine,
                                                              const std::vector<Ranges>& from) {
  DCP_RETURN_IF_ERROR(CheckUsable("IAllGatherV"));
  DCP_RETURN_IF_ERROR(comm_internal::CheckGatherLists(from.size(), size_));
  auto st = std::make_shared<OpState>();
  DCP_ASSIGN_OR_RETURN(MPI_Datatype send, RangesType("IAllGatherV", *st, mine));
  for (std::span<std::byte> r : mine) st->data_bytes += r.size() * static_cast<uint64_t>(size_ - 1);
  for (const Ranges& f : from) {
    for (std::span<std::byte> r : f) st->data_bytes += r.size();
  }
  st->counts.assign(size_, 0);  // send counts
  st->recv_counts.assign(size_, 0);
  st->send_types.assign(size_, MPI_BYTE);
  st->recv_types.assign(size_, MPI_BYTE);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (send != MPI_DATATYPE_NULL) {
      st->counts[r] = 1;
      st->send_types[r] = send;
    }
    DCP_ASSIGN_OR_RETURN(MPI_Datatype recv, RangesType("IAllGatherV", *st, from[r]));
    if (recv != MPI_DATATYPE_NULL) {
      st->recv_counts[r] = 1;
      st->recv_types[r] = recv;
    }
  }
  return PostAllToAllW("IAllGatherV", st);
}

Result<std::unique_ptr<CommRequest>> MpiCommImpl::IScatterV(const std::vector<Ranges>& to,
                                                            const Ranges& into,
                                                            const std::vector<uint64_t>& part_bytes,
                                                            int root) {
  DCP_RETURN_IF_ERROR(CheckUsable("IScatterV"));
  DCP_ASSIGN_OR_RETURN(const std::vector<uint64_t> offsets,
                       comm_internal::CheckScatterLists(to, into, part_bytes, root, rank_, size_));
  auto st = std::make_shared<OpState>();
  st->data_bytes = rank_ == root ? offsets.back() : part_bytes[rank_];
  st->counts.assign(size_, 0);
  st->recv_counts.assign(size_, 0);
  st->send_types.assign(size_, MPI_BYTE);
  st->recv_types.assign(size_, MPI_BYTE);
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      if (r == root) continue;
      DCP_ASSIGN_OR_RETURN(MPI_Datatype send, RangesType("IScatterV", *st, to[r]));
      if (send != MPI_DATATYPE_NULL) {
        st->counts[r] = 1;
        st->send_types[r] = send;
      }
    }
  } else {
    DCP_ASSIGN_OR_RETURN(MPI_Datatype recv, RangesType("IScatterV", *st, into));
    if (recv != MPI_DATATYPE_NULL) {
      st->recv_counts[root] = 1;
      st->recv_types[root] = recv;
    }
  }
  return PostAllToAllW("IScatterV", st);
}

// MPI_Finalize waits for pending operations; after a timeout one may never complete (its peer
// stopped), so the job is aborted instead, and mpirun returns.
void FinalizeMpiAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (!Abandoned::Get().Settle(std::chrono::milliseconds(1000))) {
    AbortJob(
        "a timed-out or failed MPI operation is still pending at exit, so MPI_Finalize could "
        "wait forever: aborting the job (MPI_Abort)");
  }
  MPI_Finalize();
}

}  // namespace

std::shared_ptr<Comm> MpiComm(MPI_Comm comm) { return MpiCommWithLimits(comm, MpiLimits{}); }

std::shared_ptr<Comm> MpiCommWithLimits(MPI_Comm comm, MpiLimits limits) {
  limits.max_count = std::min<uint64_t>(limits.max_count, INT_MAX);
  limits.chunk = std::clamp<uint64_t>(limits.chunk, 1, INT_MAX);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    throw Error(FailedPrecondition(
        "MpiComm: MPI is not initialized (or already finalized); call EnsureMpiInitialized first"));
  }
  MPI_Comm dup = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(comm, &dup);
  if (rc != MPI_SUCCESS) throw Error(MpiError("MPI_Comm_dup", rc));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return std::make_shared<MpiCommImpl>(dup, limits);
}

void EnsureMpiInitialized(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    throw Error(FailedPrecondition("MPI was already finalized; it cannot start again"));
  if (initialized) return;  // the caller's: never finalized by dcp
  int provided = 0;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) throw Error(MpiError("MPI_Init_thread", rc));
  std::atexit(FinalizeMpiAtExit);
}

}  // namespace dcp

#endif  // DCP_WITH_MPI
