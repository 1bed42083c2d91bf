// The async saver: stage on the calling thread, persist on a thread of its own.
//
// Why a background thread with its own communicator is safe: the persisting thread runs the
// ordinary save (checkpoint::Save) on a staged copy that nobody else touches, and every
// collective it issues goes through a communicator derived for it (Comm::CreateGroup over
// all ranks, on the calling thread, in call order, so every rank derives it at the same
// point). Comms are used by one thread each: the caller's only by the caller, the derived one
// only by the persisting thread. Under MPI the derived one is a separate MPI communicator
// (MPI_Comm_create_group), so its messages never match the caller's, and MPI_THREAD_MULTIPLE
// allows the two threads to be inside MPI at once. Saves persist one at a time, in call order,
// so the saver's collectives are issued in the same order on every rank.
#include "async/async_saver.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "async/copy_threads.h"
#include "async/staging_pool.h"
#include "checkpoint/save.h"
#include "core/cpu_share.h"

namespace dcp {

struct AsyncSaveState {
  std::string dir;
  StagingStats staging;  // written before the handle is returned, constant after

  mutable std::mutex mu;  // guards done and result
  mutable std::condition_variable cv;
  bool done = false;
  Result<SaveResult> result{SaveResult{}};  // final once done
};

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Each staged chunk starts on a cache line.
uint64_t AlignUp(uint64_t n) { return (n + 63) / 64 * 64; }

struct Job {
  std::shared_ptr<AsyncSaveState> state;
  AsyncSaveCallback on_done;
  std::string dir;
  SaveOptions opts;  // comm: the saver's own
  storage::FileSystem* fs = nullptr;
  StateDict staged;  // views into the pool buffer `lease_id`
  int lease_id = -1;
  Status error;        // staging failed: persist reports this instead
  bool agree = false;  // run the first exchange so that every rank learns `error`
};

}  // namespace

struct AsyncSaverAccess {
  static AsyncSave Handle(std::shared_ptr<AsyncSaveState> s) { return AsyncSave(std::move(s)); }
  static AsyncSaver::Impl& Of(AsyncSaver& s) { return *s.impl_; }
};

struct AsyncSaver::Impl {
  explicit Impl(const AsyncSaverOptions& o)
      : opts(o),
        pool(async::NewHostAllocator(), o.max_staging_bytes),
        // staging_threads = 0: this process's CPUs shared among the ranks of this node.
        copiers(o.staging_threads > 0 ? o.staging_threads : CpusPerLocalRank()) {
    // Statics the persisting thread uses must outlive a saver destroyed at exit (the default
    // one waits for its last save then): constructing them first destroys them later.
    (void)storage::PosixFileSystem();
    persister = std::jthread([this] { PersistLoop(); });
  }

  ~Impl() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    cv.notify_all();
    persister.join();  // after the queue drained: every pending save finished
  }

  bool OnPersister() const { return std::this_thread::get_id() == persister.get_id(); }

  AsyncSave Save(const StateDict& sd, const std::string& dir, const SaveOptions& save_opts,
                 AsyncSaveCallback on_done, storage::FileSystem& fs) {
    if (OnPersister()) {
      throw Error(FailedPrecondition("async save to " + dir +
                                     ": Save called from a completion callback of the same saver"));
    }
    return Enqueue(dir, save_opts, std::move(on_done), fs, [&](Job* job) {
      return Stage(sd, job, &job->state->staging).Annotate("staging: ");
    });
  }

  // A save whose staging is `stage` (its error: this rank's failure, which the persisting
  // thread makes every rank learn).
  AsyncSave Enqueue(const std::string& dir, const SaveOptions& save_opts, AsyncSaveCallback on_done,
                    storage::FileSystem& fs, const std::function<Status(Job*)>& stage) {
    std::lock_guard save_lock(save_mu);
    const auto t0 = Clock::now();
    auto state = std::make_shared<AsyncSaveState>();
    state->dir = dir;
    Job job;
    job.state = state;
    job.on_done = std::move(on_done);
    job.dir = dir;
    job.opts = save_opts;
    job.fs = &fs;
    auto own = OwnComm(save_opts.comm);
    if (!own.ok()) {
      job.error = own.status().Annotate("deriving the saver's communicator: ");
    } else {
      job.opts.comm = *own;
      job.error = stage(&job);
      job.agree = !job.error.ok() && job.opts.use_collectives;
    }
    state->staging.blocked_seconds = Seconds(t0, Clock::now());
    {
      std::lock_guard lock(mu);
      queue.push_back(std::move(job));
      ++pending;
    }
    cv.notify_all();
    return AsyncSaverAccess::Handle(std::move(state));
  }

  // The communicator the persisting thread uses for saves on `c`: derived from it once.
  Result<std::shared_ptr<Comm>> OwnComm(const std::shared_ptr<Comm>& c) {
    if (!c || c->size() == 1) return LocalComm();  // no one to talk to
    auto it = comms.find(c.get());
    if (it != comms.end()) return it->second.own;
    DCP_RETURN_IF_ERROR(c->CheckConcurrentUse());
    std::vector<int> all(c->size());
    for (int r = 0; r < c->size(); ++r) all[r] = r;
    DCP_ASSIGN_OR_RETURN(std::shared_ptr<Comm> own, c->CreateGroup(all));
    // The entry keeps `c` alive, so its address is never reused by another communicator.
    comms.emplace(c.get(), Derived{c, own});
    return own;
  }

  // Staging memory `sd` needs: every tensor chunk, each on a cache line of its own.
  static Result<uint64_t> StagingBytes(const StateDict& sd) {
    uint64_t need = 0;
    for (const StateEntry& e : sd.entries()) {
      for (const TensorChunk& tc : e.chunks) {
        const uint64_t n = tc.view.NumBytes();
        if (tc.view.memory != MemoryKind::kHost) {
          return InvalidArgument("chunk " + tc.box.ToString() + " of '" + e.fqn +
                                 "' is not in host memory; async save stages host memory only");
        }
        if (n > 0 && tc.view.data == nullptr) {
          return InvalidArgument("chunk " + tc.box.ToString() + " of '" + e.fqn +
                                 "' has no memory (null data)");
        }
        need += AlignUp(n);
      }
    }
    return need;
  }

  void Prepare(const StateDict& sd, const SaveOptions& save_opts) {
    if (OnPersister()) {
      throw Error(FailedPrecondition("AsyncSaver::Prepare called from a completion callback"));
    }
    std::lock_guard save_lock(save_mu);
    Status st = OwnComm(save_opts.comm).status().Annotate("deriving the saver's communicator: ");
    if (st.ok()) {
      // A buffer acquired and released at once stays idle in the pool, where the next
      // Save's best-fit search finds it.
      auto lease = [&]() -> Result<async::StagingPool::Lease> {
        DCP_ASSIGN_OR_RETURN(uint64_t need, StagingBytes(sd));
        return pool.Acquire(need);
      }();
      if (lease.ok()) {
        pool.Release(lease->id);
      } else {
        st = lease.status();
      }
    }
    st = st.Annotate("async saver: preparing staging memory: ");
    if (save_opts.comm && save_opts.comm->size() > 1) st = AgreeOnStatus(*save_opts.comm, st);
    ThrowIfError(st);
  }

  Status Stage(const StateDict& sd, Job* job, StagingStats* st) {
    DCP_ASSIGN_OR_RETURN(uint64_t need, StagingBytes(sd));
    DCP_ASSIGN_OR_RETURN(async::StagingPool::Lease lease, pool.Acquire(need));
    job->lease_id = lease.id;
    st->wait_seconds = lease.wait_seconds;
    st->bytes_allocated = lease.bytes_allocated;
    st->allocations = lease.allocations;
    st->reused = lease.allocations == 0;

    // The staged state dict: the same entries, chunks and boxes, over the pool's memory.
    const auto t0 = Clock::now();
    std::vector<async::CopyPiece> pieces;
    StateDict& staged = job->staged;
    uint64_t offset = 0;
    for (const StateEntry& e : sd.entries()) {
      if (e.kind == StateEntry::Kind::kBytes) {
        staged.add_bytes(e.fqn, e.bytes);  // small: owned by the staged state dict
        if (!e.path.empty()) staged.set_path(e.fqn, e.path);
        st->bytes_staged += e.bytes.size();
        continue;
      }
      staged.add_empty(e.fqn, e.dtype, e.global_shape);
      if (!e.path.empty()) staged.set_path(e.fqn, e.path);  // the nesting load_all rebuilds
      for (const TensorChunk& tc : e.chunks) {
        const uint64_t n = tc.view.NumBytes();
        std::byte* dst = lease.block.data() + offset;
        if (n > 0) pieces.push_back({tc.view.bytes(), dst, n});
        staged.add(e.fqn, TensorView(dst, tc.view.dtype, tc.view.shape),
                   Chunk{e.global_shape, tc.box.offsets});
        offset += AlignUp(n);
        st->bytes_staged += n;
      }
    }
    st->threads = copiers.Copy(pieces);
    st->copy_seconds = Seconds(t0, Clock::now());
    const auto ps = pool.stats();
    st->pool_bytes = ps.bytes_allocated;
    st->pool_allocations = ps.allocations;
    return OkStatus();
  }

  void PersistLoop() {
    if (opts.persist_nice != 0) {
      // Linux applies a nice value to the calling thread alone; a failure only costs priority.
      (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), opts.persist_nice);
    }
    while (true) {
      Job job;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, and every save finished
        job = std::move(queue.front());
        queue.pop_front();
      }
      Persist(job);
      {
        std::lock_guard lock(mu);
        --pending;
      }
      cv.notify_all();
    }
  }

  void Persist(Job& job) {
    const std::string where = "save to " + job.dir + ": ";
    Result<SaveResult> r = Internal(where + "not run");
    // Nothing thrown here may leave the thread (std::terminate): it becomes the save's error.
    try {
      if (job.error.ok()) {
        r = checkpoint::Save(job.staged, job.dir, job.opts, *job.fs);
      } else if (job.agree) {
        r = checkpoint::JoinSaveAsFailed(job.dir, job.opts, job.error);
      } else {
        r = job.error.Annotate(where);
      }
    } catch (const std::exception& e) {
      r = Internal(where + "unexpected exception in the persisting thread: " + e.what());
    } catch (...) {
      r = Internal(where + "unexpected exception in the persisting thread");
    }
    // The buffer first, so that a caller woken by the result finds it free.
    job.staged = StateDict();
    if (job.lease_id >= 0) pool.Release(job.lease_id);
    {
      std::lock_guard lock(job.state->mu);
      job.state->result = std::move(r);
      job.state->done = true;
    }
    job.state->cv.notify_all();
    if (job.on_done) {
      try {
        job.on_done(AsyncSaverAccess::Handle(job.state));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "dcp: async save callback for %s threw: %s\n", job.dir.c_str(),
                     e.what());
      } catch (...) {
        std::fprintf(stderr, "dcp: async save callback for %s threw\n", job.dir.c_str());
      }
    }
  }

  void WaitAll() {
    if (OnPersister()) {
      throw Error(FailedPrecondition("AsyncSaver::WaitAll called from a completion callback"));
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }

  const AsyncSaverOptions opts;
  async::StagingPool pool;
  async::CopyThreads copiers;

  std::mutex save_mu;  // serializes Save calls: staging, the copiers and `comms`
  struct Derived {
    std::shared_ptr<Comm> parent;  // the caller's
    std::shared_ptr<Comm> own;     // used by the persisting thread only
  };
  std::unordered_map<const Comm*, Derived> comms;  // guarded by save_mu

  std::mutex mu;  // guards queue, pending and stopping
  std::condition_variable cv;
  std::deque<Job> queue;  // staged, waiting for the persisting thread
  int pending = 0;        // saves not yet finished (queued or persisting)
  bool stopping = false;
  std::jthread persister;  // last: joined (in ~Impl) before the members above go
};

AsyncSaver::AsyncSaver(AsyncSaverOptions opts) : impl_(std::make_unique<Impl>(opts)) {}

AsyncSaver::~AsyncSaver() = default;

AsyncSave AsyncSaver::Save(const StateDict& sd, const std::string& dir, const SaveOptions& opts,
                           AsyncSaveCallback on_done) {
  return impl_->Save(sd, dir, opts, std::move(on_done), *ValueOrThrow(storage::FileSystemFor(dir)));
}

AsyncSave AsyncSaver::Fail(const std::string& dir, Status why, const SaveOptions& opts) {
  if (why.ok()) why = InvalidArgument("AsyncSaver::Fail called with an OK status");
  if (impl_->OnPersister()) {
    throw Error(FailedPrecondition("async save to " + dir +
                                   ": Fail called from a completion callback of the same saver"));
  }
  // No file system is touched: the save ends in its first exchange.
  return impl_->Enqueue(dir, opts, {}, storage::PosixFileSystem(), [&](Job*) { return why; });
}

void AsyncSaver::Prepare(const StateDict& sd, const SaveOptions& opts) { impl_->Prepare(sd, opts); }

void AsyncSaver::WaitAll() { impl_->WaitAll(); }

AsyncSaver::PoolStats AsyncSaver::pool_stats() const {
  const auto s = impl_->pool.stats();
  return {s.bytes_allocated, s.bytes_in_use, s.allocations, s.buffers, s.waiting};
}

bool AsyncSave::Poll() const {
  std::lock_guard lock(state_->mu);
  return state_->done;
}

void AsyncSave::Wait() const {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
}

bool AsyncSave::Wait(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mu);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->done; });
}

SaveResult AsyncSave::Get() const {
  Wait();
  std::lock_guard lock(state_->mu);
  return ValueOrThrow(state_->result);
}

Status AsyncSave::status() const {
  Wait();
  std::lock_guard lock(state_->mu);
  return state_->result.status();
}

const StagingStats& AsyncSave::staging() const { return state_->staging; }
const std::string& AsyncSave::dir() const { return state_->dir; }

AsyncSave async_save(const StateDict& sd, const std::string& dir, const SaveOptions& opts,
                     AsyncSaveCallback on_done) {
  // Destroyed at exit, after atexit handlers registered before it was built (MPI's finalize
  // when MPI was initialized first), and waiting for its pending save.
  static AsyncSaver saver;
  return saver.Save(sd, dir, opts, std::move(on_done));
}

namespace async {

AsyncSave SaveWithFileSystem(AsyncSaver& saver, const StateDict& sd, const std::string& dir,
                             const SaveOptions& opts, AsyncSaveCallback on_done,
                             storage::FileSystem& fs) {
  return AsyncSaverAccess::Of(saver).Save(sd, dir, opts, std::move(on_done), fs);
}

}  // namespace async
}  // namespace dcp
