// The communication interface: the only place that talks to other ranks.
//
// Backends: LocalComm (a world of one, the default), FileComm (plans and results exchanged
// through files on a shared filesystem, no communication group needed), MPI (dcp/mpi_comm.h,
// when built with MPI). A caller may implement Comm over its own transport (the Python package
// does, over torch.distributed).
//
// Errors: the Comm interface is the public API's one extension point and returns Status /
// Result values, as backends produce them; every other public call throws dcp::Error.
//
// Contract for every backend:
// - Collectives must be called by every rank of the communicator in the same order; they are
//   matched by call order, so consecutive collectives never mix.
// - Every blocking call fails with kDeadlineExceeded after `timeout()` rather than hanging;
//   the message names the operation and the ranks that did not arrive. After a timeout the
//   communicator is not usable any more (MPI cannot cancel a collective): fail the job.
// - A Comm object is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/status.h"

namespace dcp {

// An operation started by a non-blocking collective. Destroying a request that has not
// completed is allowed; backends that must finish it (MPI) wait for it, bounded by the
// communicator's timeout.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // Blocks until the operation completed, or fails with kDeadlineExceeded after the
  // communicator's timeout (counted from this call).
  virtual Status Wait() = 0;
  // True once the operation completed (Wait() then returns at once); never blocks.
  virtual Result<bool> Test() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A short name for logs and errors: "local", "threads", "file", "mpi".
  virtual std::string_view backend() const = 0;
  // Whether this backend moves tensor data (read-once broadcast during load). Backends
  // that only carry plans and results (FileComm) say no, and load reads without them.
  virtual bool moves_tensor_data() const { return true; }
  // OK when a communicator derived from this one (CreateGroup) may be used from another
  // thread while this one is in use, as async save's persisting thread does. MPI needs
  // MPI_THREAD_MULTIPLE for it; the error says what to do.
  virtual Status CheckConcurrentUse() const { return OkStatus(); }

  // Every rank contributes `mine`; every rank receives all contributions in rank order.
  virtual Result<std::vector<std::string>> AllGather(std::string_view mine) = 0;
  // `root` receives all contributions in rank order; the others receive an empty vector.
  virtual Result<std::vector<std::string>> Gather(std::string_view mine, int root) = 0;
  // `root`'s `data` reaches every rank (`data` is resized on receivers).
  virtual Status Broadcast(std::string& data, int root) = 0;
  virtual Status Barrier() = 0;

  // Starts broadcasting `root`'s `buf` into `buf` on every other rank. `buf` has the same size
  // on every rank and the caller keeps it alive, and does not touch it, until Wait() returned
  // OK (after a timeout, until the communicator is destroyed; the MPI backend ends the job
  // instead, see dcp/mpi_comm.h). Several requests may be in
  // flight; they complete in call order. Backends that carry plans rather than tensor data
  // (FileComm) may complete it before returning.
  virtual Result<std::unique_ptr<CommRequest>> IBroadcast(std::span<std::byte> buf, int root) = 0;

  // Byte ranges taken, or filled, in order as one message.
  using Ranges = std::vector<std::span<std::byte>>;

  // Starts an all-gather of scattered memory: every rank sends the bytes of `mine` to every
  // other rank and receives rank r's into `from[r]` (from.size() == size(); from[rank()] is not
  // touched). from[r] lists ranges of the same sizes, in the same order, as rank r's `mine` (the
  // callers derive both from one shared plan); a rank with nothing to send passes no ranges and
  // takes part all the same. Memory rules as IBroadcast: every range stays alive and untouched
  // until Wait() returned OK. This backend default runs one IBroadcast per sender's range of
  // at least kInPlaceBytes, straight between the ranges, and packs the smaller ones of a sender
  // into broadcasts of up to kPackBytes; MPI sends everything in one MPI_Ialltoallw between the
  // ranges themselves.
  virtual Result<std::unique_ptr<CommRequest>> IAllGatherV(const Ranges& mine,
                                                           const std::vector<Ranges>& from);
  static constexpr uint64_t kInPlaceBytes = uint64_t{1} << 20;
  // Whether IAllGatherV moves every range in place (no buffers of its own), as MPI does.
  virtual bool gathers_in_place() const { return false; }
  static constexpr uint64_t kPackBytes = uint64_t{4} << 20;

  // Starts a scatter of scattered memory from `root`: member m receives `part_bytes[m]` bytes
  // into its ranges `into` (their sizes summing to that), which the root sends from `to[m]`
  // (root: to.size() == size(), to[root] and its own `into` are not used; the others pass no
  // `to`). Every member passes the same `part_bytes` (the callers derive it from one shared
  // plan); a member whose part is empty takes part all the same. Memory rules as IBroadcast.
  // This backend default broadcasts all parts packed into one buffer, from which each member
  // copies its own; backends where scatters_parts() is true move each member only its part.
  virtual Result<std::unique_ptr<CommRequest>> IScatterV(const std::vector<Ranges>& to,
                                                         const Ranges& into,
                                                         const std::vector<uint64_t>& part_bytes,
                                                         int root);
  // Whether IScatterV moves each member only its part (MPI, threads), so that a root sending
  // members different parts of one buffer costs the bytes they need, not a broadcast of it.
  virtual bool scatters_parts() const { return false; }

  // A communicator over the ranks `ranks` (sorted, unique, including this rank) of this one.
  // Called by the members only, in the same order as their other calls to CreateGroup; the
  // result's rank() is this rank's index in `ranks` and it starts with this comm's timeout.
  virtual Result<std::shared_ptr<Comm>> CreateGroup(const std::vector<int>& ranks) = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 private:
  std::chrono::milliseconds timeout_{std::chrono::minutes(10)};
};

// A world of one process: collectives return the caller's own contribution.
std::shared_ptr<Comm> LocalComm();

// Rank `rank` of `size` processes that share the filesystem holding `dir` (created if
// missing). Messages are files under `{dir}/.dcp-comm/`, published by rename. `dir` must be
// private to one communicator: a leftover directory from an earlier run, or two live
// FileComms over the same `dir`, would mix messages, so name it after the job. Meant for plans
// and results, not tensor data. Throws dcp::Error if the directory cannot be created.
std::shared_ptr<Comm> FileComm(std::string dir, int rank, int size);

// All ranks learn whether every rank succeeded. Returns OK only if all did; otherwise the
// first failing rank's status, prefixed "rank R: ", on every rank.
Status AgreeOnStatus(Comm& comm, const Status& mine);

}  // namespace dcp
