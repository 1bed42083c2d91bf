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
#include "manager/manager_impl.h"
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

// Whether some step of `entries` references files of `step` (a base whose metadata is gone
// still holds bytes its referrers need: they decide, not the cleanup).
bool IsBase(const std::vector<manager::Scan::Entry>& entries, int64_t step) {
  for (const auto& e : entries) {
    if (e.bases.count(step)) return true;
  }
  return false;
}

}  // namespace

void CheckpointManager::Impl::Open() {
  Status st;
  std::string payload;
  if (rank == 0) {
    st = fs.CreateDirs(root).Annotate("checkpoint root: ");
    if (st.ok()) {
      st = lock.Acquire(fs, JoinPath(root, manager::kLockName), "checkpoint root " + root,
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
        for (auto it = complete.rbegin(); it != complete.rend() && bases.count(*it); ++it) ++chain;
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

std::optional<int64_t> CheckpointManager::Impl::NewestStep() const {
  std::optional<int64_t> newest;
  if (!steps.empty()) newest = steps.back();
  if (!memory_steps.empty() && (!newest || memory_steps.back() > *newest)) {
    newest = memory_steps.back();
  }
  return newest;
}

void CheckpointManager::Impl::MarkBad(int64_t step, const std::string& why) {
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

std::string CheckpointManager::Impl::NextBase() const {
  const bool incremental =
      opts.incremental && !steps.empty() && incrementals_in_a_row + 1 < opts.full_every;
  return incremental ? Dir(steps.back()) : std::string();
}

SaveOptions CheckpointManager::Impl::RootSaveOptions() {
  SaveOptions o = opts.save;
  o.incremental_base = NextBase();
  saving_incremental = !o.incremental_base.empty();
  return o;
}

Status CheckpointManager::Impl::WriteLatest(int64_t step) {
  return fs.WriteAtomic(JoinPath(root, manager::kLatestName), std::to_string(step) + "\n", ".tmp")
      .Annotate("update " + JoinPath(root, manager::kLatestName) + ": ");
}

void CheckpointManager::Impl::CheckNewStep(int64_t step) {
  if (step < 0) ThrowIfError(InvalidArgument("step " + std::to_string(step) + " is negative"));
  if (auto newest = NewestStep(); newest && step <= *newest) {
    ThrowIfError(InvalidArgument("step " + std::to_string(step) +
                                 " is not newer than the newest saved step " +
                                 std::to_string(*newest) + " under " + root));
  }
}

void CheckpointManager::Impl::Finalize(int64_t step, const Status& saved) {
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

void CheckpointManager::Impl::RemoveFromSteps(const std::vector<int64_t>& removed) {
  for (int64_t r : removed) {
    steps.erase(std::remove(steps.begin(), steps.end(), r), steps.end());
    referencing.erase(r);
  }
}

std::vector<int64_t> CheckpointManager::Impl::Retire(const std::vector<int64_t>& complete,
                                                     int64_t latest) {
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

void CheckpointManager::Impl::Finish() {
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
