// A manager root's memory tier: this host's directory of recent steps in
// memory, and the collective operations over every host's -- replication after a save, the
// drain to durable storage, and the restore from whatever survives.
//
// Layout on each host: DIR/<root key>/<host name>/step_N/, an ordinary dcp checkpoint
// directory holding the metadata, the files this host's ranks wrote (a save with
// SaveOptions::per_host_directory) and the files partner hosts replicated to it. The host
// name is part of the path, so hosts that share DIR by mistake (or emulated hosts of one
// machine) never mix their files. What a host holds is read from its directory, never
// remembered: a tier survives the processes that wrote it, and a restarted job finds it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dcp/checkpoint.h"
#include "dcp/comm.h"
#include "dcp/memory_tier.h"
#include "dcp/state_dict.h"
#include "metadata/metadata.h"
#include "storage/file_system.h"
#include "tier/file_transfer.h"
#include "tier/tier_plan.h"

namespace dcp::tier {

// Where a restore finds durable steps: the complete ones, their directories, the file system.
struct DurableSteps {
  std::set<int64_t> complete;
  std::function<std::string(int64_t)> dir_of;
  storage::FileSystem* fs = nullptr;
  // Complete steps that reference a base (incremental): their files are not the memory copy's,
  // so they never fill in a file the hosts lack.
  std::set<int64_t> referencing;

  // The complete steps whose files are the memory copy's.
  std::set<int64_t> FileSources() const {
    std::set<int64_t> out;
    std::set_difference(complete.begin(), complete.end(), referencing.begin(), referencing.end(),
                        std::inserter(out, out.end()));
    return out;
  }
};

class MemoryTier {
 public:
  // Collective over `comm` (every rank learns every rank's host); the first rank of each host
  // creates its directory. kInvalidArgument for options that make no sense.
  static Result<std::unique_ptr<MemoryTier>> Open(const std::string& root,
                                                  const MemoryTierOptions& opts, Comm& comm);

  const MemoryTierOptions& options() const { return opts_; }
  const Hosts& hosts() const { return hosts_; }
  int my_host() const { return hosts_.host_of_rank[rank_]; }
  // The lowest rank of this host: it scans and tidies the host's directory.
  bool first_of_host() const { return hosts_.ranks[my_host()].front() == rank_; }
  std::string HostDir() const { return host_dir_; }
  std::string StepDir(int64_t step) const;

  // Collective: every host's inventory (its first rank scans it), by host index.
  Result<std::vector<Inventory>> Survey(Comm& comm) const;

  // Collective: whether the state dicts about to be saved (`my_bytes` on this rank, an upper
  // bound of what it writes) fit every host's budget, counting what partners will send and the
  // `kept` newest steps each host keeps beside it. Same answer on every rank; the reason when
  // not.
  Result<std::string> CheckBudget(Comm& comm, uint64_t my_bytes, size_t kept) const;

  // Collective on groups.world(): each rank's files of `step` (just saved here) go to the
  // partner hosts. Returns this rank's failure (callers agree).
  Status Replicate(PairGroups& groups, int64_t step, TransferStats* stats) const;

  // Collective: `step` written into the durable directory `dst` (on `fs`): every rank copies
  // the files it wrote from this host's tier, then rank 0 commits the metadata. Agreed.
  // With `base` (a committed sibling of `dst`, the same on every rank), incrementally: chunks
  // the base holds are referenced, not copied (checkpoint/incremental_copy.h); a base that
  // cannot be read makes a whole copy, with a warning. *referenced (every rank alike): whether
  // the copy references the base.
  Status Drain(Comm& comm, int64_t step, storage::FileSystem& fs, const std::string& dst,
               const std::string& base = {}, bool* referenced = nullptr) const;

  // This host (its first rank; others return at once): removes the step directories below
  // step `below` but the newest `keep` of them.
  void Retain(size_t keep, int64_t below = INT64_MAX) const;
  // This host (its first rank; others return at once): marks the copies of `steps` that a
  // restore passed over (damaged, or incomplete on every host): no survey offers them again,
  // and the next retention removes them. `why` is written into the mark for people.
  void MarkPassedOver(const std::vector<int64_t>& steps, const std::string& why) const;
  // This host (its first rank): removes the copy of `step` if it was passed over, before the
  // step is saved again (call before the save's first collective).
  void DropPassedOver(int64_t step) const;

  // What a restore passed over, the same on every rank, for the load result whether it came
  // from memory or then from the root (LoadResult::fell_back, LoadResult::damaged_copies).
  struct Account {
    std::string fell_back;                    // "step N in memory: <why>; ..."
    std::vector<std::string> damaged_copies;  // "host H: step N, FILE: <why>"
  };

  // Collective on groups.world(): loads into `sd` the newest step the tiers (with the durable
  // steps filling files no tier holds) can restore -- or `only_step` -- unless a durable step
  // is newer: then nullopt, and the caller loads from storage. Copies are verified before use;
  // a bad one is passed over for another copy, then for an older step (`*account` says why).
  Result<std::optional<LoadResult>> Restore(PairGroups& groups, StateDict& sd,
                                            const LoadOptions& opts, const DurableSteps& durable,
                                            std::optional<int64_t> only_step,
                                            Account* account) const;

 private:
  MemoryTier(MemoryTierOptions opts, std::string host_dir, Hosts hosts, int rank)
      : opts_(std::move(opts)),
        host_dir_(std::move(host_dir)),
        hosts_(std::move(hosts)),
        rank_(rank) {}

  MemoryTierOptions opts_;
  std::string host_dir_;
  Hosts hosts_;
  int rank_;
};

// This host's directory of the tier of `root` under `base`.
std::string HostTierDir(const std::string& base, const std::string& root);
// Its inventory, read-only, without a job (`dcp ls --memory-tier`); kNotFound when absent.
Result<Inventory> ScanHostTier(const std::string& base, const std::string& root);

}  // namespace dcp::tier
