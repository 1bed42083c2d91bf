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
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/mpi/mpi_comm_impl.h"

namespace dcp {
namespace mpi_internal {

Status MpiError(std::string_view op, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    len = std::snprintf(text, sizeof(text), "unknown MPI error");
  }
  return Unavailable("mpi " + std::string(op) + ": " + std::string(text, len) + " (code " +
                     std::to_string(rc) + ")");
}

[[noreturn]] void AbortJob(const std::string& why) {
  std::fprintf(stderr, "dcp: %s\n", why.c_str());
  std::fflush(nullptr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

MpiCommImpl::MpiCommImpl(MPI_Comm comm, MpiLimits limits) : comm_(comm), limits_(limits) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommImpl::~MpiCommImpl() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // too late to free anything; MPI released it all
  // Operations still running (MPI may write into their buffers) are in Abandoned already.
  for (auto& p : pongs_) Abandoned::Get().Add(std::move(p));
  MPI_Comm_free(&comm_);
}

Status MpiCommImpl::CheckConcurrentUse() const {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level >= MPI_THREAD_MULTIPLE) return OkStatus();
  const char* name = level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                     : level == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED"
                                                    : "MPI_THREAD_SINGLE";
  return FailedPrecondition(
      std::string("async save over MPI needs MPI_THREAD_MULTIPLE, but MPI was initialized with ") +
      name +
      ": initialize it with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or "
      "dcp::EnsureMpiInitialized, or save synchronously");
}

Result<std::vector<std::string>> MpiCommImpl::AllGather(std::string_view mine) {
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
    DCP_RETURN_IF_ERROR(Posted("AllGather", st,
                               MPI_Iallgatherv(st->send.data(), static_cast<int>(st->send.size()),
                                               MPI_BYTE, st->recv.data(), st->counts.data(),
                                               st->displs.data(), MPI_BYTE, comm_, &st->reqs[0])));
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

Result<std::vector<std::string>> MpiCommImpl::Gather(std::string_view mine, int root) {
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
    DCP_RETURN_IF_ERROR(Posted(
        "Gather", st,
        MPI_Igatherv(st->send.data(), static_cast<int>(st->send.size()), MPI_BYTE, st->recv.data(),
                     st->counts.data(), st->displs.data(), MPI_BYTE, root, comm_, &st->reqs[0])));
  } else if (is_root) {
    if (!st->send.empty())
      std::memcpy(st->recv.data() + offsets[rank_], st->send.data(), st->send.size());
    for (int r = 0; r < size_; ++r) {
      if (r == root) continue;
      for (uint64_t off = 0; off < st->sizes[r]; off += limits_.chunk) {
        int count = static_cast<int>(std::min<uint64_t>(limits_.chunk, st->sizes[r] - off));
        st->reqs.emplace_back();
        DCP_RETURN_IF_ERROR(Posted("Gather", st,
                                   MPI_Irecv(st->recv.data() + offsets[r] + off, count, MPI_BYTE, r,
                                             kGatherTag, comm_, &st->reqs.back())));
      }
    }
  } else {
    for (uint64_t off = 0; off < st->send.size(); off += limits_.chunk) {
      int count = static_cast<int>(std::min<uint64_t>(limits_.chunk, st->send.size() - off));
      st->reqs.emplace_back();
      DCP_RETURN_IF_ERROR(Posted("Gather", st,
                                 MPI_Isend(st->send.data() + off, count, MPI_BYTE, root, kGatherTag,
                                           comm_, &st->reqs.back())));
    }
  }
  DCP_RETURN_IF_ERROR(Complete("Gather", st, deadline));
  if (!is_root) return std::vector<std::string>{};
  return Split(st->recv, offsets);
}

Status MpiCommImpl::Broadcast(std::string& data, int root) {
  DCP_RETURN_IF_ERROR(CheckUsable("Broadcast"));
  DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("Broadcast", root, size_));
  const Clock::time_point deadline = Clock::now() + timeout();
  ++calls_;
  const bool is_root = rank_ == root;
  auto st = std::make_shared<OpState>();
  st->my_size = is_root ? data.size() : 0;
  st->reqs.resize(1);
  DCP_RETURN_IF_ERROR(Posted("Broadcast", st,
                             MPI_Ibcast(&st->my_size, 1, MPI_UINT64_T, root, comm_, &st->reqs[0])));
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

Status MpiCommImpl::Barrier() {
  DCP_RETURN_IF_ERROR(CheckUsable("Barrier"));
  const Clock::time_point deadline = Clock::now() + timeout();
  ++calls_;
  auto st = std::make_shared<OpState>();
  st->reqs.resize(1);
  DCP_RETURN_IF_ERROR(Posted("Barrier", st, MPI_Ibarrier(comm_, &st->reqs[0])));
  return Complete("Barrier", st, deadline);
}

Result<std::shared_ptr<Comm>> MpiCommImpl::CreateGroup(const std::vector<int>& ranks) {
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

Status MpiCommImpl::Complete(std::string_view op, const std::shared_ptr<OpState>& st,
                             Clock::time_point deadline) {
  // Every call checked usability before posting; a break since then with this operation in
  // flight (a caller-memory broadcast) aborted the job.
  DCP_RETURN_IF_ERROR(CheckUsable(op));
  Poller poller(st->data_bytes);
  auto next_answer = Clock::now();
  while (true) {
    int done = 0;
    int rc =
        MPI_Testall(static_cast<int>(st->reqs.size()), st->reqs.data(), &done, MPI_STATUSES_IGNORE);
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

Result<bool> MpiCommImpl::Poll(std::string_view op, const std::shared_ptr<OpState>& st) {
  int done = 0;
  int rc =
      MPI_Testall(static_cast<int>(st->reqs.size()), st->reqs.data(), &done, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return Break(st, MpiError(op, rc));
  if (done) st->reqs.clear();
  return done != 0;
}

Status MpiCommImpl::CheckUsable(std::string_view op) const {
  if (broken_.empty()) return OkStatus();
  return FailedPrecondition("mpi " + std::string(op) +
                            ": communicator unusable after an earlier failure: " + broken_);
}

Status MpiCommImpl::Break(const std::shared_ptr<OpState>& st, Status why) {
  if (broken_.empty()) broken_ = why.message();
  Abandoned::Get().Add(st);
  if (g_caller_buffers_in_flight.load() > 0) {
    AbortJob(why.message() +
             "; a broadcast into the caller's memory is still in flight and MPI cannot cancel "
             "it, so the job is aborted rather than let MPI write into freed memory");
  }
  return why;
}

Status MpiCommImpl::Posted(std::string_view op, const std::shared_ptr<OpState>& st, int rc) {
  if (rc == MPI_SUCCESS) return OkStatus();
  st->reqs.pop_back();  // not a valid request
  return Break(st, MpiError(op, rc));
}

Status MpiCommImpl::PostBroadcast(std::string_view op, const std::shared_ptr<OpState>& st, char* p,
                                  uint64_t n, int root) {
  for (uint64_t off = 0; off < n; off += limits_.chunk) {
    int count = static_cast<int>(std::min<uint64_t>(limits_.chunk, n - off));
    st->reqs.emplace_back();
    DCP_RETURN_IF_ERROR(
        Posted(op, st, MPI_Ibcast(p + off, count, MPI_BYTE, root, comm_, &st->reqs.back())));
  }
  return OkStatus();
}

Result<std::vector<uint64_t>> MpiCommImpl::ExchangeSizes(std::string_view op,
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

void MpiCommImpl::FillCounts(OpState* st, const std::vector<uint64_t>& offsets) {
  st->counts.resize(st->sizes.size());
  st->displs.resize(st->sizes.size());
  for (size_t r = 0; r < st->sizes.size(); ++r) {
    st->counts[r] = static_cast<int>(st->sizes[r]);
    st->displs[r] = static_cast<int>(offsets[r]);
  }
}

std::vector<std::string> MpiCommImpl::Split(const std::string& all,
                                            const std::vector<uint64_t>& offsets) {
  std::vector<std::string> out(offsets.size() - 1);
  for (size_t r = 0; r + 1 < offsets.size(); ++r) {
    out[r] = all.substr(offsets[r], offsets[r + 1] - offsets[r]);
  }
  return out;
}

Status MpiCommImpl::Rendezvous(const std::vector<int>& ranks) {
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

Result<bool> MpiCommImpl::AwaitPointToPoint(const std::shared_ptr<OpState>& st,
                                            Clock::time_point deadline) {
  Poller poller;
  while (true) {
    int done = 0;
    int rc =
        MPI_Testall(static_cast<int>(st->reqs.size()), st->reqs.data(), &done, MPI_STATUSES_IGNORE);
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

}  // namespace mpi_internal

namespace {

using mpi_internal::Abandoned;
using mpi_internal::AbortJob;
using mpi_internal::MpiCommImpl;
using mpi_internal::MpiError;

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
