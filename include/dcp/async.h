// Asynchronous save: the caller is blocked only while its state is copied into host staging
// memory; planning, the plan exchange, writing and the metadata commit run in the background
// while training goes on.
//
//   dcp::AsyncSaver saver({.max_staging_bytes = 2 * state_bytes});
//   dcp::AsyncSave h = saver.Save(sd, "/ckpt/step_200", {.comm = comm});
//   /* train on: sd's memory may be overwritten as soon as Save returned */
//   h.Get();  // the SaveResult, or throws dcp::Error
//
// Design (details in docs/async-save.md):
// - Staging: every tensor chunk is copied, by `staging_threads` threads, into a pool of
//   pre-faulted host buffers owned by the saver and reused across saves; bytes entries are
//   copied into the staged state dict. The staged state dict's views point into the pool.
// - Persisting: one background thread per saver runs the ordinary save on the staged copy
//   (plan cache included). Its collectives go through a communicator of its own, created
//   from the caller's with Comm::CreateGroup(all ranks) on the calling thread, the first time
//   Save sees that communicator; the caller's communicator is never touched from the
//   background, so its collectives and the saver's never mix. With MPI this needs
//   MPI_THREAD_MULTIPLE (EnsureMpiInitialized asks for it).
// - Saves persist one at a time, in call order, on every rank alike (that order is what
//   matches the saver's collectives across ranks). A Save's staging overlaps the previous
//   persist only if the pool has room under max_staging_bytes; otherwise it waits for the
//   previous persist to release its buffers (back-pressure, never over-commit). With the
//   default cap (0: one state dict's worth) a Save therefore first waits for the previous
//   save to finish (committed or failed, its buffers released). A failed previous save does not
//   stop the next one: its error stays on its own handle.
// - Errors (a full disk, one rank failing, a staging failure) reach every rank through its
//   handle; no metadata is committed and the previous checkpoint stays loadable. A checkpoint
//   is visible only once its metadata is committed, last, so a save cut short never looks
//   complete. An exception inside the background thread becomes an error on the handle.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dcp/checkpoint.h"
#include "dcp/state_dict.h"
#include "dcp/status.h"

namespace dcp {

struct AsyncSaverOptions {
  // Staging memory the saver may hold, in bytes (all its buffers, busy or idle). 0: one
  // state dict's worth, i.e. a Save waits until the previous save released its buffers.
  // A state dict needing more than a non-zero cap fails (kInvalidArgument, naming sizes).
  uint64_t max_staging_bytes = 0;
  // Threads copying into the staging pool, the calling thread included. 0: the CPUs this
  // process may run on divided by the ranks on this node (from Open MPI's or MPICH's
  // launcher environment), between 1 and 8: more threads than free cores slow copying down.
  int staging_threads = 0;
  // Nice value for the persisting thread (Linux: per thread), so that writing and
  // checksumming yield the CPU to training when cores are short. 0: the caller's priority.
  int persist_nice = 10;
};

// What staging one save did (on this rank).
struct StagingStats {
  uint64_t bytes_staged = 0;      // tensor chunks + bytes entries copied
  uint64_t bytes_allocated = 0;   // new staging memory allocated for this save
  uint64_t allocations = 0;       // new staging buffers allocated for this save
  bool reused = false;            // staged into existing buffers only
  uint64_t pool_bytes = 0;        // staging memory the saver holds after staging
  uint64_t pool_allocations = 0;  // buffers the saver allocated since it was created
  int threads = 0;                // threads that copied
  double wait_seconds = 0;        // waiting for buffers (back-pressure)
  double copy_seconds = 0;        // copying
  double blocked_seconds = 0;     // the whole Save call
};

struct AsyncSaveState;    // shared by a handle and the persisting thread
struct AsyncSaverAccess;  // the library's internals

// The handle of one asynchronous save. Cheap to copy; all copies see the same save. Every
// method is thread-safe and may be called from the completion callback.
class AsyncSave {
 public:
  AsyncSave() = default;  // no save: valid() is false, the other methods must not be called

  bool valid() const { return state_ != nullptr; }
  // True once the save finished (successfully or not); never blocks.
  bool Poll() const;
  // Blocks until the save finished. The background save is bounded by the communicator's
  // timeout for collectives, not for storage calls that hang.
  void Wait() const;
  // True if the save finished within `timeout`.
  bool Wait(std::chrono::milliseconds timeout) const;
  // Waits, then returns the result or throws the save's dcp::Error.
  SaveResult Get() const;
  // Waits, then returns OK or the save's error.
  Status status() const;
  // Staging statistics; available as soon as Save returned.
  const StagingStats& staging() const;
  const std::string& dir() const;

 private:
  friend struct AsyncSaverAccess;
  explicit AsyncSave(std::shared_ptr<AsyncSaveState> s) : state_(std::move(s)) {}
  std::shared_ptr<AsyncSaveState> state_;
};

// Runs on the persisting thread after the save's result is published (Poll() is true), with
// no lock of the saver held. It must not call Save on the same saver or destroy it; an
// exception it throws is reported on stderr and otherwise ignored.
using AsyncSaveCallback = std::function<void(const AsyncSave&)>;

// Owns the staging pool, the staging threads, the persisting thread and the communicators
// it derived. Save may be called from one thread at a time (calls are serialized).
class AsyncSaver {
 public:
  explicit AsyncSaver(AsyncSaverOptions opts = {});
  // Waits for every pending save to finish (persisted or failed), then joins the threads.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Every rank of opts.comm calls it, in the same order as its other Saves and collectives
  // on opts.comm (the first Save with a communicator of size > 1 derives the saver's own
  // communicator from it: a collective). Returns once `sd` is staged: from then on the
  // caller may change or free sd's memory. Save failures are reported through the handle
  // (on every rank), not thrown; calling Save from a callback throws kFailedPrecondition.
  AsyncSave Save(const StateDict& sd, const std::string& dir, const SaveOptions& opts = {},
                 AsyncSaveCallback on_done = {});

  // In place of Save on a rank whose part failed before it had a state dict to stage (its
  // caller's preparation): takes part in the save as Save would, with `why` as this rank's
  // failure, so that every rank's handle fails instead of its peers waiting for it. Same
  // collective order as Save (and, like Save, refused from a completion callback). Every
  // handle reports the lowest failing rank's error, prefixed "rank R: save to DIR: ".
  AsyncSave Fail(const std::string& dir, Status why, const SaveOptions& opts = {});

  // Optional, ahead of the first Save: gets the saver ready to stage `sd` (or any state dict
  // needing no more staging memory) so that the first Save blocks only for its copy, like
  // later ones. Allocates and pre-faults a staging buffer of the size `sd` needs, left idle in
  // the pool for the next Save to take, and derives the saver's communicator from opts.comm.
  // Both otherwise happen inside the first Save, which then blocks several times longer than
  // a memcpy of its bytes. Call it once the state dict exists, before the training loop.
  // A collective like Save (every rank of opts.comm calls it at the same point of its call
  // sequence); an error on any rank (the memory cannot be had, sd exceeds a non-zero
  // max_staging_bytes) is thrown as dcp::Error on every rank. Under the cap it waits, as
  // Save does, for buffers held by pending saves. A later Save needing more memory than was
  // prepared allocates as without Prepare; calling it again with a larger state dict grows
  // the pool. Sizes only are read from `sd`, never its data.
  void Prepare(const StateDict& sd, const SaveOptions& opts = {});

  // Blocks until every save started so far finished.
  void WaitAll();

  struct PoolStats {
    uint64_t bytes_allocated = 0;  // staging memory held now
    uint64_t bytes_in_use = 0;     // of which by saves not yet persisted
    uint64_t allocations = 0;      // buffers allocated since creation
    uint64_t buffers = 0;          // buffers held now
    uint64_t waiting = 0;          // Save calls waiting for buffers now (back-pressure)
  };
  PoolStats pool_stats() const;

 private:
  friend struct AsyncSaverAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Save through a process-wide AsyncSaver with default options, created on first use and
// destroyed at exit (which waits for its pending save).
AsyncSave async_save(const StateDict& sd, const std::string& dir, const SaveOptions& opts = {},
                     AsyncSaveCallback on_done = {});

}  // namespace dcp
