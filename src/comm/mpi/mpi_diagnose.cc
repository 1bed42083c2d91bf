// The MPI backend after a timeout: which call every other rank of the communicator waits in,
// asked with point-to-point pings that ranks answer while they poll inside any call, so the
// error names the ranks that stopped or wait elsewhere (mpi_comm_impl.h).
#if defined(DCP_WITH_MPI)

#include <algorithm>

#include "comm/mpi/mpi_comm_impl.h"

namespace dcp::mpi_internal {

void MpiCommImpl::AnswerPings() {
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

Status MpiCommImpl::Diagnose(std::string_view op) {
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

std::string MpiCommImpl::WorldRankNote(const std::vector<int>& ranks) const {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (ranks.empty() || world_size == size_) return {};
  MPI_Group mine, world;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> out(ranks.size(), MPI_UNDEFINED);
  MPI_Group_translate_ranks(mine, static_cast<int>(ranks.size()), ranks.data(), world, out.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  return "; in MPI_COMM_WORLD: rank(s) " + comm_internal::JoinRanks(out);
}

}  // namespace dcp::mpi_internal

#endif  // DCP_WITH_MPI
