// The checkpoint manager: one directory per training step under a root, a `latest` record,
// retention, and resume from the newest complete step -- safe against a crash at any moment.
//
//   dcp::CheckpointManager mgr("/ckpt", {.keep_last = 3, .keep_every = 1000}, comm);
//   if (auto step = mgr.latest_step()) { mgr.Load(sd); start = *step + 1; }
//   for (int64_t step = start; ...; ++step) {
//     train(step);
//     // Returns once sd is staged, after finishing the previous save (latest, retention).
//     if (step % 100 == 0) mgr.AsyncSave(step, sd);
//   }
//   mgr.Wait();
//
// Layout: ROOT/step_000000100/ (an ordinary dcp checkpoint), ROOT/latest (the step number,
// replaced atomically: tmp + fsync + rename + directory fsync), ROOT/.dcp-manager.lock,
// ROOT/.recycle/ (retired data files the next save overwrites; ManagerOptions::recycle_files).
//
// Guarantees:
// - `latest` is written only after the step's metadata commit is durable and every rank knows
//   it (the save's commit verdict is broadcast; the manager then agrees on it over the comm).
// - Retention removes a step only when it is older than the step `latest` names, that newer
//   step is durable, and the policy does not keep it; the newest complete step is never
//   removed. A step is removed metadata first, so a crash half-way leaves an incomplete
//   directory (ignored, cleaned up later), never a damaged step that looks complete.
// - Resume trusts the disk, not `latest`: the newest *complete* step wins (its metadata reads
//   and decodes, and every data file it names is present with its recorded size). Other step
//   directories are ignored. Those without committed metadata (a save that never committed,
//   a removal cut short) are removed by rank 0 when the manager opens the root, when no save
//   is in flight; one whose metadata names missing or short files is left for a person.
// - One manager per root: ROOT/.dcp-manager.lock, held with flock and a lease renewed while the
//   manager lives (storage/lease_lock.h); a second manager (in this or any process) is refused
//   with kFailedPrecondition naming the holder. A lock left by a dead process of the same host
//   is taken over at once, one of another host once its lease ran out unrenewed.
//
// Collectives: every rank of `comm` constructs the manager and calls Save, AsyncSave, Load,
// Wait, Keep, Prune and the destructor in the same order. Only rank 0 touches `latest`,
// removes steps and holds the lock; all ranks must see the same root (shared storage).
//
// Async saves: one save in flight. AsyncSave first finishes the previous one (waits for it,
// then updates `latest` and runs retention on the calling thread), then stages `sd` and
// returns. Wait() finishes the save in flight. A failed save leaves `latest` and every kept
// step as they were; its error is thrown by the Wait or AsyncSave that finishes it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dcp/async.h"
#include "dcp/checkpoint.h"
#include "dcp/comm.h"
#include "dcp/memory_tier.h"
#include "dcp/state_dict.h"

namespace dcp {

struct RetentionPolicy {
  // Keep the K newest complete steps. Unset: no limit from this rule.
  std::optional<int64_t> keep_last;
  // Also keep every step that is a multiple of M (e.g. one per 1000 steps for evaluation).
  std::optional<int64_t> keep_every;
  // Neither set: keep everything. Only keep_every set: keep its multiples and the newest step.
};

// OK, or kInvalidArgument for a setting that would delete more than a user means by it:
// keep_last below 1 or keep_every below 1 (an unset value, not 0 or -1, keeps everything).
// The manager refuses such a policy when it is created.
Status ValidateRetention(const RetentionPolicy& policy);

// The steps whose files each step of an incremental root references (SaveOptions::
// incremental_base): step -> its bases. Steps without references have no entry.
using StepBases = std::map<int64_t, std::set<int64_t>>;

// The pure retention rule: which of `steps` (complete steps on disk, any order) to remove,
// given the step `latest` durably names, the policy, the steps kept on demand and the bases
// of incremental steps. Removes only steps older than `latest` (nothing when latest is unset
// or not among `steps`), never the newest step, never one the policy or `keeps` keeps, never
// a base of a step kept (nor, so that it stays loadable, a base of that base). Sorted
// ascending.
std::vector<int64_t> StepsToRemove(const std::vector<int64_t>& steps, std::optional<int64_t> latest,
                                   const RetentionPolicy& policy,
                                   const std::set<int64_t>& keeps = {},
                                   const StepBases& bases = {});

// "step_000000100": the directory name of a step (zero-padded so names sort; 9 digits or more).
std::string StepDirName(int64_t step);
// The step a directory name stands for; nullopt for any other name.
std::optional<int64_t> ParseStepDirName(const std::string& name);

// What is on disk under a root (`dcp ls`): read-only, takes no lock.
struct StepInfo {
  int64_t step = 0;
  std::string dir;     // full path
  uint64_t bytes = 0;  // sum of the sizes of the files in the directory
  bool complete = false;
  std::string problem;  // why not complete (empty when complete)
  // Incremental steps: the steps whose files this one references, and the steps referencing
  // this one's (it is kept as their base while they are).
  std::vector<int64_t> bases;
  std::vector<int64_t> referenced_by;
};
struct RootInfo {
  std::vector<StepInfo> steps;           // every step directory, ascending
  std::optional<int64_t> latest_record;  // what ROOT/latest says (may be stale or damaged)
  std::optional<int64_t> latest;         // the newest complete step: what a resume loads
  uint64_t recycle_files = 0;            // retired data files in ROOT/.recycle/
  uint64_t recycle_bytes = 0;

  std::vector<int64_t> complete_steps() const;  // ascending
  StepBases bases() const;                      // of the steps with references
};
RootInfo inspect_root(const std::string& root);

// `dcp unlock PATH`: removes the locks at `path` (a manager's root: ROOT/.dcp-manager.lock; a
// checkpoint directory: DIR/dcp.lock) whoever holds them, for a person who knows that job is
// gone (ManagerOptions::break_lock and SaveOptions::break_lock do the same at start). A holder
// alive on this host (it holds the file's kernel lock) is refused with kFailedPrecondition.
// Returns one line per lock removed, naming its holder; kNotFound when there is none. Throws
// dcp::Error.
std::vector<std::string> unlock(const std::string& path);

// What this host's memory tier holds of a root (`dcp ls --memory-tier`): read-only.
struct MemoryStepInfo {
  int64_t step = 0;
  bool has_metadata = false;
  uint64_t files = 0;        // data files here
  uint64_t files_named = 0;  // data files the step's metadata names
  uint64_t bytes = 0;        // of the data files here
  std::vector<int> writers;  // the ranks that wrote the files here (own ranks and partners')
};
struct HostTierInfo {
  std::string dir;                    // this host's directory of the root's tier
  std::vector<MemoryStepInfo> steps;  // ascending
};
// Throws dcp::Error (kNotFound) when this host holds no tier of `root` under `tier_dir`.
HostTierInfo inspect_memory_tier(const std::string& root, const std::string& tier_dir);

struct ManagerOptions {
  RetentionPolicy policy;
  std::shared_ptr<Comm> comm;  // null: a world of one
  // File recycling: a retired step's tensor data files move to ROOT/.recycle/ (one per writer
  // rank) and the next save overwrites them in place instead of creating new files, which
  // storage that allocates new blocks slowly writes faster (docs/manager.md).
  // Only files of removed steps are recycled; kept steps are never touched. Off: retired
  // files are deleted and ROOT/.recycle/ is removed.
  bool recycle_files = true;
  SaveOptions save;  // its comm is replaced by `comm`
  LoadOptions load;  // its comm is replaced by `comm`
  AsyncSaverOptions async;
  // Unset: no memory tier; every save goes to the root.
  std::optional<MemoryTierOptions> memory_tier;
  // Incremental saves (docs/incremental.md): each save writes only the stored chunks that
  // changed since the newest complete step, which it references for the rest; retention keeps
  // a step while a kept step references it. With a memory tier, steps in memory stay whole and
  // each drain into the root is incremental.
  bool incremental = false;
  // With `incremental`: every full_every-th save is a full one (at most full_every - 1
  // incremental saves follow a full save), so a damaged base costs at most that many saves.
  // 1: every save full.
  int64_t full_every = 10;
  // The root's lock (ROOT/.dcp-manager.lock) and every step's save lock: a holder on another
  // host renews it every lease/4 seconds while it runs; one not renewed for this long is gone
  // and the next manager breaks its lock with a warning naming it (docs/failure-modes.md).
  // A dead holder of this host is seen at once.
  double lock_lease_seconds = 300;
  // Take the root's lock from a holder not seen alive on this host (a person who knows that
  // job is gone; `dcp unlock ROOT` does the same by hand).
  bool break_lock = false;
};

class CheckpointManager {
 public:
  struct Impl;

  // Every rank calls it. Takes the root's lock (rank 0), creates the root if needed, removes
  // incomplete step directories (rank 0) and finds the complete steps. Throws dcp::Error:
  // kFailedPrecondition when another manager holds the root.
  CheckpointManager(const std::string& root, ManagerOptions opts);
  CheckpointManager(const std::string& root, RetentionPolicy policy,
                    std::shared_ptr<Comm> comm = nullptr);
  // Finishes the save in flight (errors are reported on stderr) and releases the lock.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves `sd` as `step` (greater than every step saved before), then updates `latest` and
  // applies retention. Finishes the save in flight first. Throws dcp::Error.
  SaveResult Save(int64_t step, const StateDict& sd);
  // Finishes the save in flight, then stages `sd` and returns; the rest happens in the
  // background and is finished by the next AsyncSave, Save, Wait or Load.
  void AsyncSave(int64_t step, const StateDict& sd);
  // Finishes the save in flight: waits for it, updates `latest`, applies retention. Throws
  // its error.
  void Wait();
  // Optional, before the first AsyncSave: allocates and pre-faults the staging memory `sd`
  // needs, so the first AsyncSave blocks only for its copy (AsyncSaver::Prepare). Collective.
  void PrepareAsyncSave(const StateDict& sd);

  // The newest complete step (finished saves only), in the root or restorable from the
  // memory tiers; nullopt before the first one.
  std::optional<int64_t> latest_step() const;
  // The complete steps on disk (in the root), ascending.
  std::vector<int64_t> steps() const;
  // With a memory tier: the steps the hosts' tiers can restore, ascending.
  std::vector<int64_t> memory_steps() const;
  // With a memory tier: writes the newest step this manager saved to memory into the root
  // when the root lacks it (the manager's end does it too, MemoryTierOptions::persist_at_exit).
  // Collective; finishes the save in flight first.
  void Persist();
  // Loads `step` (default: the newest complete one) into sd. Finishes the save in flight
  // first. Throws kNotFound when there is no such complete step. Default step only, without
  // allow_partial: a step whose data turns out corrupt or missing (kDataLoss, kNotFound, the
  // same error on every rank) is marked bad on disk (the file `dcp.bad` in its directory,
  // holding why; never deleted, no longer complete, shown by `dcp ls`) and the newest older
  // complete step is loaded instead, on every rank alike; LoadResult::fell_back says why.
  LoadResult Load(StateDict& sd, std::optional<int64_t> step = std::nullopt);
  // Never remove `step` (through retention or prune) while this manager lives.
  void Keep(int64_t step);
  // Applies the policy now; returns the steps removed (or, with dry_run, that would be).
  std::vector<int64_t> Prune(bool dry_run = false);

  const std::string& root() const;
  std::string step_dir(int64_t step) const;

  // The library's internals (src/manager/manager.h builds one over any file system).
  explicit CheckpointManager(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcp
