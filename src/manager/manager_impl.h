// The checkpoint manager's state and steps (dcp/manager.h), shared by its two halves:
// manager.cc (the root: open, finalize, retention, the public calls) and tier_steps.cc (the
// memory tier: saves into it, replication, drains, restore accounting).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "async/async_saver.h"
#include "dcp/manager.h"
#include "manager/manager.h"
#include "storage/file_system.h"
#include "storage/lease_lock.h"
#include "tier/memory_tier.h"

namespace dcp {

// What happened to a step saved into the memory tier, in the order it happens.
struct TierOutcome {
  Status saved;
  Status replicated;
  bool drain_due = false;
  Status drained;
  bool drained_incremental = false;  // the drained step references a base
};

struct CheckpointManager::Impl {
  std::string root;
  ManagerOptions opts;
  storage::FileSystem& fs;
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

  Impl(std::string r, ManagerOptions o, storage::FileSystem& f)
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

  std::string Dir(int64_t step) const { return storage::JoinPath(root, StepDirName(step)); }

  std::string RecycleDir() const { return storage::JoinPath(root, manager::kRecycleName); }

  // Where a removed step's data files go: the recycle directory, or nowhere (deleted).
  const std::string& RetiredFilesTo() const { return opts.save.recycle_dir; }

  // Rank 0: lock, scan, clean up; everyone: the complete steps.
  void Open();

  // The newest step saved: in the root or, restorable, in the memory tiers.
  std::optional<int64_t> NewestStep() const;

  SaveOptions TierSaveOptions() const;

  // Whether `step` goes to the memory tier: room is made (each host keeps keep_last - 1 older
  // steps beside it) and the budget checked; a step over it is saved to the root, with a warning.
  // Older steps are removed here (`retain_now`) or, for an async save, by its background job
  // once the save is written, off the caller's path (unlinking memory is not free, and would
  // compete with the staging copy): until then a host holds one step more, which the budget
  // counts.
  bool TierTakes(int64_t step, const StateDict& sd, bool retain_now);

  // The root's complete steps, as a tier restore sees them.
  tier::DurableSteps Durable() const;

  // After the save of `step` into the tier ended with `saved` (the same on every rank):
  // replication to partner hosts, then the drain to the root when due (incrementally against
  // `base` when given: DrainBase). Collective on `c`.
  TierOutcome RunTierSteps(Comm& c, tier::PairGroups& groups, int64_t step, const Status& saved,
                           const std::string& base);

  // After a load (of no given step) found `loaded` the newest step it could restore: newer
  // memory steps were passed over (damaged, or incomplete on every host). They are marked, so
  // no restart offers them again, and leave the account, so latest_step() and the next save
  // follow the step loaded (the same on every rank: memory_steps is).
  void ForgetMemoryStepsAbove(int64_t loaded, const std::string& why);

  void FinalizeTier(int64_t step, const TierOutcome& o);

  void EnsureBackgroundComm();

  // Drains the newest step this manager saved to memory, when the root lacks it.
  void Persist();

  // A step a load found corrupt: no longer complete, on every rank; rank 0 records why in the
  // step directory (never deleting it) and points `latest` at the newest step left.
  void MarkBad(int64_t step, const std::string& why);

  // The base of the next save into the root: the newest complete step when saves are
  // incremental and the chain is not yet full_every - 1 long; empty for a full save.
  std::string NextBase() const;

  SaveOptions RootSaveOptions();

  Status WriteLatest(int64_t step);

  void CheckNewStep(int64_t step);

  // After the save of `step` ended with `saved` on this rank: all ranks agree; on success
  // rank 0 points `latest` at it and applies retention.
  void Finalize(int64_t step, const Status& saved);

  void RemoveFromSteps(const std::vector<int64_t>& removed);

  // Rank 0: removes what the policy retires, given that `latest` durably names `latest`.
  // Best effort (a failure leaves a step more, never fewer); returns the steps removed.
  std::vector<int64_t> Retire(const std::vector<int64_t>& complete, int64_t latest);

  void Finish();
};

}  // namespace dcp
