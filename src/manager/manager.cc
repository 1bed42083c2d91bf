#include "manager/manager.h"

#include <algorithm>
#include <cstdio>
#include <future>
#include <numeric>

#include "async/async_saver.h"
#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/save.h"
#include "checkpoint/save_lock.h"
#include "comm/exchange.h"
#include "manager/root_state.h"
#include "storage/lease_lock.h"
#include "tier/memory_tier.h"

namespace dcp {

using manager::CheckComplete;
using manager::DecodeSteps;
using manager::EncodeSteps;
using manager::HasNoMetadata;
using manager::ReadLatestRecord;
using manager::RemoveStepDir;
using manager::ScanRoot;
using manager::TidyRecycleDir;
using storage::FileSystem;
using storage::JoinPath;

namespace {

// What happened to a step saved into the memory tier, in the order it happens.
struct TierOutcome {
  Status saved;
  Status replicated;
  bool drain_due = false;
  Status drained;
  bool drained_incremental = false;  // the drained step references a base
};

// An upper bound of the bytes a rank writes when saving `sd` (its whole state: replicas are
// written once, by one holder, so this overestimates; headers are small beside a margin).
uint64_t StateBytesBound(const StateDict& sd) {
  uint64_t n = uint64_t{1} << 16;
  for (const auto& e : sd.entries()) {
    if (e.kind == StateEntry::Kind::kBytes) {
      n += e.bytes.size() + 64;
      continue;
    }
    for (const auto& c : e.chunks) {
      if (auto b = DTypeBytes(e.dtype, c.box.NumElements())) n += *b + 256;
    }
  }
  return n;
}

// Whether some step of `entries` references files of `step` (a base whose metadata is gone
// still holds bytes its referrers need: they decide, not the cleanup).
bool IsBase(const std::vector<manager::Scan::Entry>& entries, int64_t step) {
  for (const auto& e : entries) {
    if (e.bases.count(step)) return true;
  }
  return false;
}

}  // namespace

struct CheckpointManager::Impl {
  std::string root;
  ManagerOptions opts;
  FileSystem& fs;
  std::shared_ptr<Comm> comm;
  int rank = 0;
  storage::LeaseLock lock;     // rank 0's, for the manager's life
  std::vector<int64_t> steps;  // complete, ascending; the same on every rank
  std::set<int64_t> keeps;
  std::unique_ptr<AsyncSaver> saver;
  dcp::AsyncSave pending;
  int64_t pending_step = -1;
  // The memory tier (ManagerOptions::memory_tier), its pair groups on `comm`, and for async
  // saves a communicator of its own with its groups, used by the background tier job only.
  std::unique_ptr<tier::MemoryTier> tier;
  std::unique_ptr<tier::PairGroups> fg_groups;
  std::shared_ptr<Comm> bg_comm;
  std::unique_ptr<tier::PairGroups> bg_groups;
  std::future<TierOutcome> tier_job;
  std::vector<int64_t> memory_steps;  // restorable from the tiers, ascending
  std::set<int64_t> saved_in_memory;  // by this manager (it can drain them)
  // Incremental roots: rank 0's account of which steps reference which (retention keeps the
  // bases of kept steps); on every rank, the incremental saves since the newest full one, and
  // whether the save being finished is one.
  StepBases bases;
  int64_t incrementals_in_a_row = 0;
  bool saving_incremental = false;
  // On every rank: the complete steps that may reference a base (their files are not the
  // memory tier's copies of them).
  std::set<int64_t> referencing;

  Impl(std::string r, ManagerOptions o, FileSystem& f)
      : root(std::move(r)), opts(std::move(o)), fs(f) {
    comm = opts.comm ? opts.comm : LocalComm();
    rank = comm->rank();
    opts.save.comm = comm;
    opts.load.comm = comm;
    opts.save.lock_lease_seconds = opts.lock_lease_seconds;
    // Recycling renames retired files: a copy of every byte on an object store.
    if (fs.IsObjectStore()) opts.recycle_files = false;
    opts.save.recycle_dir = opts.recycle_files ? RecycleDir() : std::string();
  }

  std::string Dir(int64_t step) const { return JoinPath(root, StepDirName(step)); }
  std::string RecycleDir() const { return JoinPath(root, manager::kRecycleName); }
  // Where a removed step's data files go: the recycle directory, or nowhere (deleted).
  const std::string& RetiredFilesTo() const { return opts.save.recycle_dir; }

  // Rank 0: lock, scan, clean up; everyone: the complete steps.
  void Open() {
    Status st;
    std::string payload;
    if (rank == 0) {
      st = fs.CreateDirs(root).Annotate("checkpoint root: ");
      if (st.ok()) {
        st =
            lock.Acquire(fs, JoinPath(root, manager::kLockName), "checkpoint root " + root,
                         "manager", checkpoint::SaveIdHex(checkpoint::RandomSaveId()),
                         {.lease_seconds = opts.lock_lease_seconds, .break_lock = opts.break_lock});
      }
      if (st.ok()) {
        auto scan = ScanRoot(fs, root);
        st = scan.status();
        if (st.ok()) {
          std::vector<int64_t> complete;
          for (const auto& e : scan->entries) {
            if (!e.bases.empty()) bases[e.step] = e.bases;
            if (e.status.ok()) {
              complete.push_back(e.step);
            } else if (HasNoMetadata(fs, Dir(e.step)) && !IsBase(scan->entries, e.step)) {
              // Deleted, never recycled: a straggling rank of a killed job may still be
              // writing through an open descriptor; a recycled file would carry its writes
              // into a later step.
              Status rm = RemoveStepDir(fs, Dir(e.step), /*recycle_dir=*/std::string());
              if (!rm.ok()) {
                std::fprintf(stderr, "dcp manager: could not clean up incomplete %s: %s\n",
                             Dir(e.step).c_str(), rm.message().c_str());
              }
            }
          }
          for (const auto& t : scan->latest_tmps) (void)fs.Remove(JoinPath(root, t));
          TidyRecycleDir(fs, RecycleDir(), opts.recycle_files, comm->size());
          // `latest` names the newest complete step: repair a stale or damaged record.
          if (!complete.empty() && scan->latest_record != complete.back()) {
            Status w = WriteLatest(complete.back());
            if (!w.ok()) {
              std::fprintf(stderr, "dcp manager: could not update %s/latest: %s\n", root.c_str(),
                           w.message().c_str());
            }
          }
          // The incremental saves since the newest full one, counted down from the newest.
          int64_t chain = 0;
          for (auto it = complete.rbegin(); it != complete.rend() && bases.count(*it); ++it)
            ++chain;
          std::vector<int64_t> with_bases;
          for (int64_t s : complete) {
            if (bases.count(s)) with_bases.push_back(s);
          }
          payload =
              EncodeSteps(complete) + "/ " + std::to_string(chain) + "/" + EncodeSteps(with_bases);
        }
      }
    }
    // "<complete steps>/ <incremental chain>/<steps with bases>"
    const std::string agreed = ValueOrThrow(BroadcastOrFail(*comm, 0, st, payload));
    const size_t slash = agreed.find('/'), second = agreed.find('/', slash + 1);
    steps = DecodeSteps(agreed.substr(0, slash));
    if (second != std::string::npos) {
      incrementals_in_a_row = DecodeSteps(agreed.substr(slash + 1, second - slash - 1))[0];
      for (int64_t s : DecodeSteps(agreed.substr(second + 1))) referencing.insert(s);
    }
    if (opts.memory_tier) {
      tier = ValueOrThrow(tier::MemoryTier::Open(root, *opts.memory_tier, *comm));
      fg_groups = std::make_unique<tier::PairGroups>(comm);
      const auto inventories = ValueOrThrow(tier->Survey(*comm));
      memory_steps = tier::RestorableSteps(inventories, Durable().FileSources());
    }
  }

  // The newest step saved: in the root or, restorable, in the memory tiers.
  std::optional<int64_t> NewestStep() const {
    std::optional<int64_t> newest;
    if (!steps.empty()) newest = steps.back();
    if (!memory_steps.empty() && (!newest || memory_steps.back() > *newest)) {
      newest = memory_steps.back();
    }
    return newest;
  }

  // ---- The memory tier ----

  SaveOptions TierSaveOptions() const {
    SaveOptions o = opts.save;
    o.per_host_directory = true;
    o.recycle_dir.clear();
    return o;
  }

  // Whether `step` goes to the memory tier: room is made (each host keeps keep_last - 1 older
  // steps beside it) and the budget checked; a step over it is saved to the root, with a warning.
  // Older steps are removed here (`retain_now`) or, for an async save, by its background job
  // once the save is written, off the caller's path (unlinking memory is not free, and would
  // compete with the staging copy): until then a host holds one step more, which the budget
  // counts.
  bool TierTakes(int64_t step, const StateDict& sd, bool retain_now) {
    if (!tier) return false;
    tier->DropPassedOver(step);  // a copy a restore passed over is not this save's
    const auto keep = static_cast<size_t>(tier->options().keep_last - 1);
    if (retain_now) {
      tier->Retain(keep, step);
      while (memory_steps.size() > keep) memory_steps.erase(memory_steps.begin());
    }
    const std::string over =
        ValueOrThrow(tier->CheckBudget(*comm, StateBytesBound(sd), retain_now ? keep : keep + 1));
    if (over.empty()) return true;
    if (rank == 0) {
      std::fprintf(stderr, "dcp manager: step %lld is not kept in memory (%s); saving it to %s\n",
                   static_cast<long long>(step), over.c_str(), root.c_str());
    }
    return false;
  }

  // The root's complete steps, as a tier restore sees them.
  tier::DurableSteps Durable() const {
    return {std::set<int64_t>(steps.begin(), steps.end()), [this](int64_t s) { return Dir(s); },
            &fs, referencing};
  }

  // After the save of `step` into the tier ended with `saved` (the same on every rank):
  // replication to partner hosts, then the drain to the root when due (incrementally against
  // `base` when given: DrainBase). Collective on `c`.
  TierOutcome RunTierSteps(Comm& c, tier::PairGroups& groups, int64_t step, const Status& saved,
                           const std::string& base) {
    TierOutcome o;
    o.saved = saved;
    if (!saved.ok()) return o;
    tier::TransferStats stats;
    o.replicated = AgreeOnStatus(c, tier->Replicate(groups, step, &stats));
    const int64_t every = tier->options().persist_every;
    o.drain_due = every > 0 && step % every == 0;
    if (o.drain_due) o.drained = tier->Drain(c, step, fs, Dir(step), base, &o.drained_incremental);
    return o;
  }

  // After a load (of no given step) found `loaded` the newest step it could restore: newer
  // memory steps were passed over (damaged, or incomplete on every host). They are marked, so
  // no restart offers them again, and leave the account, so latest_step() and the next save
  // follow the step loaded (the same on every rank: memory_steps is).
  void ForgetMemoryStepsAbove(int64_t loaded, const std::string& why) {
    std::vector<int64_t> passed;
    for (int64_t s : memory_steps) {
      if (s > loaded) passed.push_back(s);
    }
    if (passed.empty()) return;
    tier->MarkPassedOver(passed, why.empty() ? "passed over by a restore" : why);
    std::erase_if(memory_steps, [&](int64_t s) { return s > loaded; });
    for (int64_t s : passed) saved_in_memory.erase(s);
  }

  void FinalizeTier(int64_t step, const TierOutcome& o) {
    Status agreed = AgreeOnStatus(*comm, o.saved);
    if (!agreed.ok()) {
      throw Error(
          agreed.Annotate("checkpoint manager: step " + std::to_string(step) + " (memory tier): "));
    }
    memory_steps.push_back(step);
    saved_in_memory.insert(step);
    const auto keep = static_cast<size_t>(tier->options().keep_last);
    tier->Retain(keep);
    while (memory_steps.size() > keep) memory_steps.erase(memory_steps.begin());
    if (!o.replicated.ok() && rank == 0) {
      std::fprintf(stderr,
                   "dcp manager: step %lld is in memory on the hosts that saved it only: "
                   "replication failed: %s\n",
                   static_cast<long long>(step), o.replicated.message().c_str());
    }
    if (o.drain_due) {
      saving_incremental = o.drained_incremental;
      Finalize(step, o.drained);
    }
  }

  void EnsureBackgroundComm() {
    if (bg_comm) return;
    if (comm->size() > 1) {
      ThrowIfError(comm->CheckConcurrentUse());
      std::vector<int> all(comm->size());
      std::iota(all.begin(), all.end(), 0);
      bg_comm = ValueOrThrow(comm->CreateGroup(all));
      bg_comm->set_timeout(comm->timeout());
    } else {
      bg_comm = LocalComm();
    }
    bg_groups = std::make_unique<tier::PairGroups>(bg_comm);
  }

  // Drains the newest step this manager saved to memory, when the root lacks it.
  void Persist() {
    Finish();
    if (!tier || saved_in_memory.empty()) return;
    const int64_t s = *saved_in_memory.rbegin();
    if (!steps.empty() && s <= steps.back()) return;
    if (!memory_steps.empty() && memory_steps.back() != s) return;
    bool referenced = false;
    const Status drained = tier->Drain(*comm, s, fs, Dir(s), NextBase(), &referenced);
    saving_incremental = referenced;
    Finalize(s, drained);
  }

  // A step a load found corrupt: no longer complete, on every rank; rank 0 records why in the
  // step directory (never deleting it) and points `latest` at the newest step left.
  void MarkBad(int64_t step, const std::string& why) {
    RemoveFromSteps({step});
    // The next save is full: an incremental one would compare against the base's recorded
    // checksums and reference its bytes, damaged or not (every rank marks alike).
    incrementals_in_a_row = opts.full_every;
    if (rank != 0) return;
    Status st = fs.WriteAtomic(JoinPath(Dir(step), manager::kBadName), why + "\n", ".tmp");
    if (st.ok() && !steps.empty()) st = WriteLatest(steps.back());
    if (!st.ok()) {
      std::fprintf(stderr, "dcp manager: could not mark %s bad: %s\n", Dir(step).c_str(),
                   st.message().c_str());
    }
  }

  // The base of the next save into the root: the newest complete step when saves are
  // incremental and the chain is not yet full_every - 1 long; empty for a full save.
  std::string NextBase() const {
    const bool incremental =
        opts.incremental && !steps.empty() && incrementals_in_a_row + 1 < opts.full_every;
    return incremental ? Dir(steps.back()) : std::string();
  }

  SaveOptions RootSaveOptions() {
    SaveOptions o = opts.save;
    o.incremental_base = NextBase();
    saving_incremental = !o.incremental_base.empty();
    return o;
  }

  Status WriteLatest(int64_t step) {
    return fs.WriteAtomic(JoinPath(root, manager::kLatestName), std::to_string(step) + "\n", ".tmp")
        .Annotate("update " + JoinPath(root, manager::kLatestName) + ": ");
  }

  void CheckNewStep(int64_t step) {
    if (step < 0) ThrowIfError(InvalidArgument("step " + std::to_string(step) + " is negative"));
    if (auto newest = NewestStep(); newest && step <= *newest) {
      ThrowIfError(InvalidArgument("step " + std::to_string(step) +
                                   " is not newer than the newest saved step " +
                                   std::to_string(*newest) + " under " + root));
    }
  }

  // After the save of `step` ended with `saved` on this rank: all ranks agree; on success
  // rank 0 points `latest` at it and applies retention.
  void Finalize(int64_t step, const Status& saved) {
    Status agreed = AgreeOnStatus(*comm, saved);
    if (!agreed.ok()) {
      throw Error(agreed.Annotate("checkpoint manager: step " + std::to_string(step) + ": "));
    }
    std::vector<int64_t> next = steps;
    next.push_back(step);
    incrementals_in_a_row = saving_incremental ? incrementals_in_a_row + 1 : 0;
    if (saving_incremental) referencing.insert(step);
    Status st;
    std::string payload;
    if (rank == 0 && saving_incremental) {
      // What the new step references: it keeps those steps from retention.
      auto mine = manager::ReadStepBases(fs, Dir(step));
      if (mine.ok()) {
        if (!mine->empty()) bases[step] = std::move(mine).value();
      } else {
        // Unknown bases: every older step may be one, until a restart reads them again.
        bases[step] = std::set<int64_t>(steps.begin(), steps.end());
        st = mine.status().Annotate("step saved, but its bases are unknown: ");
      }
    }
    saving_incremental = false;
    if (rank == 0 && st.ok()) {
      // Another job took the root (`dcp unlock`, an expired lease): `latest` and retention
      // are its business now.
      st = lock.Check();
      if (!st.ok()) st = FailedPrecondition(st.message() + "; step saved, `latest` not updated");
      if (st.ok()) st = WriteLatest(step);
      if (st.ok()) payload = EncodeSteps(Retire(next, step));
    }
    auto shared = BroadcastOrFail(*comm, 0, st, payload);
    steps = next;  // the step is complete on disk whatever happened to `latest`
    RemoveFromSteps(DecodeSteps(ValueOrThrow(std::move(shared))));
  }

  void RemoveFromSteps(const std::vector<int64_t>& removed) {
    for (int64_t r : removed) {
      steps.erase(std::remove(steps.begin(), steps.end(), r), steps.end());
      referencing.erase(r);
    }
  }

  // Rank 0: removes what the policy retires, given that `latest` durably names `latest`.
  // Best effort (a failure leaves a step more, never fewer); returns the steps removed.
  std::vector<int64_t> Retire(const std::vector<int64_t>& complete, int64_t latest) {
    std::vector<int64_t> removed;
    // Newest first: a step is removed only after every step referencing it (always newer) that
    // goes too, so a removal cut short never leaves a step whose base is half gone.
    const std::vector<int64_t> gone = StepsToRemove(complete, latest, opts.policy, keeps, bases);
    for (auto it = gone.rbegin(); it != gone.rend(); ++it) {
      const int64_t s = *it;
      Status rm = RemoveStepDir(fs, Dir(s), RetiredFilesTo());
      if (!rm.ok()) {
        std::fprintf(stderr, "dcp manager: retention could not remove %s: %s\n", Dir(s).c_str(),
                     rm.message().c_str());
        break;
      }
      removed.push_back(s);
      bases.erase(s);
    }
    std::sort(removed.begin(), removed.end());
    return removed;
  }

  void Finish() {
    if (!pending.valid()) return;
    dcp::AsyncSave h = pending;
    int64_t step = pending_step;
    pending = dcp::AsyncSave();
    pending_step = -1;
    if (tier_job.valid()) {
      FinalizeTier(step, tier_job.get());
    } else {
      Finalize(step, h.status());
    }
  }
};

CheckpointManager::CheckpointManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  const ManagerOptions& o = impl_->opts;
  const std::string where = "checkpoint manager " + impl_->root + ": ";
  ThrowIfError(ValidateRetention(o.policy).Annotate(where));
  if (o.incremental && o.full_every < 1) {
    ThrowIfError(InvalidArgument(where + "full_every=" + std::to_string(o.full_every) +
                                 " is not a number of saves (1: every save full)"));
  }
  if (!o.save.incremental_base.empty()) {
    ThrowIfError(InvalidArgument(where + "save.incremental_base is the manager's to choose: set "
                                         "ManagerOptions::incremental instead"));
  }
  impl_->Open();
}

CheckpointManager::CheckpointManager(const std::string& root, ManagerOptions opts)
    : CheckpointManager(std::make_unique<Impl>(root, std::move(opts),
                                               *ValueOrThrow(storage::FileSystemFor(root)))) {}

CheckpointManager::CheckpointManager(const std::string& root, RetentionPolicy policy,
                                     std::shared_ptr<Comm> comm)
    : CheckpointManager(root, ManagerOptions{.policy = policy, .comm = std::move(comm)}) {}

CheckpointManager::~CheckpointManager() {
  if (!impl_) return;
  try {
    impl_->Finish();
    if (impl_->tier && impl_->tier->options().persist_at_exit) impl_->Persist();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dcp manager: the last save under %s failed: %s\n", impl_->root.c_str(),
                 e.what());
  }
  impl_->saver.reset();
}

SaveResult CheckpointManager::Save(int64_t step, const StateDict& sd) {
  Impl& m = *impl_;
  m.Finish();
  m.CheckNewStep(step);
  if (m.TierTakes(step, sd, /*retain_now=*/true)) {
    auto r = checkpoint::Save(sd, m.tier->StepDir(step), m.TierSaveOptions(),
                              storage::PosixFileSystem());
    m.FinalizeTier(step, m.RunTierSteps(*m.comm, *m.fg_groups, step, r.status(), m.NextBase()));
    return std::move(r).value();
  }
  // Save creates the step's directory; `latest`'s atomic write syncs the root, which makes the
  // directory's entry durable before `latest` names it.
  auto r = checkpoint::Save(sd, m.Dir(step), m.RootSaveOptions(), m.fs);
  m.Finalize(step, r.status());
  return std::move(r).value();
}

void CheckpointManager::AsyncSave(int64_t step, const StateDict& sd) {
  Impl& m = *impl_;
  m.Finish();
  m.CheckNewStep(step);
  if (!m.saver) m.saver = std::make_unique<AsyncSaver>(m.opts.async);
  if (m.TierTakes(step, sd, /*retain_now=*/false)) {
    m.EnsureBackgroundComm();
    m.pending = async::SaveWithFileSystem(*m.saver, sd, m.tier->StepDir(step), m.TierSaveOptions(),
                                          {}, storage::PosixFileSystem());
    m.pending_step = step;
    // Replication and the drain follow in the background, on the tier's own communicator.
    m.tier_job = std::async(std::launch::async, [&m, h = m.pending, step, base = m.NextBase()] {
      try {
        const Status saved = h.status();  // waits for the save
        if (saved.ok()) m.tier->Retain(static_cast<size_t>(m.tier->options().keep_last - 1), step);
        return m.RunTierSteps(*m.bg_comm, *m.bg_groups, step, saved, base);
      } catch (const std::exception& e) {
        TierOutcome o;
        o.saved = Internal(std::string("memory tier job: ") + e.what());
        return o;
      }
    });
    return;
  }
  m.pending = async::SaveWithFileSystem(*m.saver, sd, m.Dir(step), m.RootSaveOptions(), {}, m.fs);
  m.pending_step = step;
}

void CheckpointManager::Persist() { impl_->Persist(); }

std::vector<int64_t> CheckpointManager::memory_steps() const { return impl_->memory_steps; }

void CheckpointManager::Wait() { impl_->Finish(); }

void CheckpointManager::PrepareAsyncSave(const StateDict& sd) {
  Impl& m = *impl_;
  if (!m.saver) m.saver = std::make_unique<AsyncSaver>(m.opts.async);
  m.saver->Prepare(sd, m.opts.save);
}

std::optional<int64_t> CheckpointManager::latest_step() const { return impl_->NewestStep(); }

std::vector<int64_t> CheckpointManager::steps() const { return impl_->steps; }

LoadResult CheckpointManager::Load(StateDict& sd, std::optional<int64_t> step) {
  Impl& m = *impl_;
  m.Finish();
  // Why memory steps were passed over, carried into a load from the root.
  tier::MemoryTier::Account account;
  std::string& fell_back = account.fell_back;
  if (m.tier) {
    // From the hosts' memory unless the root holds a newer step.
    auto r =
        ValueOrThrow(m.tier->Restore(*m.fg_groups, sd, m.opts.load, m.Durable(), step, &account));
    if (r && !step) m.ForgetMemoryStepsAbove(r->step, fell_back);
    if (r) return *std::move(r);
  }
  if (step) {
    if (!std::binary_search(m.steps.begin(), m.steps.end(), *step)) {
      ThrowIfError(
          NotFound("no complete checkpoint of step " + std::to_string(*step) + " under " + m.root));
    }
    LoadResult r = ValueOrThrow(checkpoint::Load(sd, m.Dir(*step), m.opts.load, m.fs));
    r.step = *step;
    r.fell_back = fell_back;
    r.damaged_copies = account.damaged_copies;
    return r;
  }
  if (m.steps.empty()) ThrowIfError(NotFound("no complete checkpoint under " + m.root));
  // Newest first. A load error is agreed by every rank, so all pass over the same steps. With
  // allow_partial no fallback: entries the older step lacks would keep bytes of the failed
  // attempt, silently.
  while (true) {
    const int64_t s = m.steps.back();
    Result<LoadResult> r = checkpoint::Load(sd, m.Dir(s), m.opts.load, m.fs);
    if (r.ok()) {
      r->step = s;
      r->fell_back = fell_back;
      r->damaged_copies = account.damaged_copies;
      if (m.tier) m.ForgetMemoryStepsAbove(s, fell_back);
      return *std::move(r);
    }
    const StatusCode code = r.status().code();
    const bool corrupt = code == StatusCode::kDataLoss || code == StatusCode::kNotFound;
    if (!corrupt || m.opts.load.allow_partial || m.steps.size() == 1) {
      ThrowIfError(fell_back.empty() ? r.status() : r.status().Annotate(fell_back + "; then "));
    }
    const std::string why = "step " + std::to_string(s) + ": " + r.status().message();
    fell_back += (fell_back.empty() ? "" : "; ") + why;
    m.MarkBad(s, why);
    std::fprintf(stderr, "dcp manager: %s; loading step %lld instead\n", why.c_str(),
                 static_cast<long long>(m.steps.back()));
  }
}

void CheckpointManager::Keep(int64_t step) { impl_->keeps.insert(step); }

std::vector<int64_t> CheckpointManager::Prune(bool dry_run) {
  Impl& m = *impl_;
  m.Finish();
  if (m.steps.empty()) return {};
  const int64_t latest = m.steps.back();
  Status st;
  std::string payload;
  if (m.rank == 0) {
    if (dry_run) {
      payload = EncodeSteps(StepsToRemove(m.steps, latest, m.opts.policy, m.keeps, m.bases));
    } else {
      // Open() pointed `latest` at the newest complete step; make sure it still does.
      if (ReadLatestRecord(m.fs, m.root) != latest) st = m.WriteLatest(latest);
      if (st.ok()) payload = EncodeSteps(m.Retire(m.steps, latest));
    }
  }
  std::vector<int64_t> removed =
      DecodeSteps(ValueOrThrow(BroadcastOrFail(*m.comm, 0, st, payload)));
  if (!dry_run) m.RemoveFromSteps(removed);
  return removed;
}

const std::string& CheckpointManager::root() const { return impl_->root; }

std::string CheckpointManager::step_dir(int64_t step) const { return impl_->Dir(step); }

namespace manager {

std::unique_ptr<CheckpointManager> NewManager(const std::string& root, ManagerOptions opts,
                                              storage::FileSystem& fs) {
  return std::make_unique<CheckpointManager>(
      std::make_unique<CheckpointManager::Impl>(root, std::move(opts), fs));
}

}  // namespace manager
}  // namespace dcp
