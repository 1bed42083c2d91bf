// The MPI backend's collectives straight between the caller's memory: IBroadcast in chunks
// whose counts fit an int, IAllGatherV and IScatterV as one MPI_Ialltoallw over datatypes that
// describe the caller's ranges (mpi_comm_impl.h).
#if defined(DCP_WITH_MPI)

#include <algorithm>
#include <climits>

#include "comm/mpi/mpi_comm_impl.h"

namespace dcp::mpi_internal {

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

}  // namespace dcp::mpi_internal

#endif  // DCP_WITH_MPI
