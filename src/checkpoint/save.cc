// Save: local plan -> exchange (or plan cache) -> global plan -> write -> commit.
//
// Every collective below is reached by every rank in the same order whatever happens
// locally: a rank that fails sends its error in the next exchange instead of leaving, so
// all ranks return the same error and no one waits for a peer that gave up.
#include "checkpoint/save.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/incremental.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/plan_cache.h"
#include "checkpoint/rank_values.h"
#include "checkpoint/save_cleanup.h"
#include "checkpoint/save_lock.h"
#include "checkpoint/value_agreement.h"
#include "checkpoint/write_mine.h"
#include "checkpoint/write_results.h"
#include "comm/exchange.h"
#include "comm/host_id.h"
#include "core/check.h"
#include "core/checksum.h"
#include "core/guarded.h"
#include "core/log.h"
#include "core/wire.h"
#include "metadata/codec.h"
#include "planner/plan_classes.h"
#include "planner/save_plan.h"
#include "storage/data_files.h"

namespace dcp::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Without collectives: every rank writes all it holds and its own metadata file. Replicas
// are not deduplicated and ranks do not agree on errors; load merges the rank files.
Result<SaveResult> SaveIndependently(const StateDict& sd, const std::string& dir, int rank,
                                     int world, const SaveOptions& opts, storage::FileSystem& fs,
                                     const SaveHooks* hooks) {
  const uint64_t step = opts.step;
  SaveResult result;
  const auto t0 = Clock::now();
  const std::string where = "save to " + dir + " (rank " + std::to_string(rank) + "): ";
  if (!opts.incremental_base.empty()) {
    return InvalidArgument(where + "incremental saves need collectives (use_collectives=true)");
  }
  auto local = planner::BuildLocalSavePlan(sd);
  if (!local.ok()) return local.status().Annotate(where);
  std::vector<std::vector<int>> holders{{rank}};
  auto plan = planner::PlanSave({*local}, holders, rank + 1, {.require_coverage = false});
  if (!plan.ok()) return plan.status().Annotate(where);
  result.unique_bytes = plan->unique_bytes;
  DCP_RETURN_IF_ERROR(fs.CreateDirs(dir).Annotate(where));
  // The step is what tells these saves apart: committing a step this rank already committed
  // (or an older one) would overwrite its file of a set other ranks may have completed.
  auto sets = ListRankSets(fs, dir);
  if (!sets.ok()) return sets.status().Annotate(where);
  for (const RankSet& set : *sets) {
    if (!set.legacy && set.step >= step && set.files.count(rank)) {
      return FailedPrecondition(where + "this rank already committed step " +
                                std::to_string(set.step) +
                                " here; saves without collectives "
                                "need SaveOptions::step to grow from save to save (now " +
                                std::to_string(step) + ")");
    }
  }
  const auto t1 = Clock::now();
  const uint64_t save_id = RandomSaveId();
  std::vector<Written> written(rank + 1);
  DCP_RETURN_IF_ERROR(
      WriteMine(sd, dir, *plan, rank, save_id, opts, fs, nullptr, &written[rank], &result)
          .Annotate(where));
  if (hooks && hooks->before_commit) {
    // This rank's files name a save no metadata names: the next save here removes them.
    DCP_RETURN_IF_ERROR(Guarded("", hooks->before_commit).Annotate(where));
  }
  const auto t2 = Clock::now();
  auto md = BuildMetadata(*plan, save_id, written, world);
  if (!md.ok()) return md.status().Annotate(where);
  DCP_RETURN_IF_ERROR(CommitMetadata(fs, dir, *md, rank, step).Annotate(where + "commit: "));
  // Until every rank has committed this step, the loadable checkpoint is the newest complete
  // older rank set, or else the global metadata file (never removed here): files they name
  // stay, as does every set newer than this one. This rank removes only its own files: its
  // metadata of older sets, then its data files that no kept metadata names.
  std::unordered_set<std::string> keep = FileNames(*md);
  std::vector<std::string> drop;
  bool collect = true;
  if (auto global = storage::ReadWholeFile(fs, storage::JoinPath(dir, std::string(kMetadataName)));
      global.ok()) {
    auto old = metadata::Decode(*global);
    collect = old.ok();  // unreadable: keep everything
    if (old.ok()) keep.merge(FileNames(*old));
  } else if (global.status().code() != StatusCode::kNotFound) {
    collect = false;
  }
  // The listing from before the commit: a set created since is another rank's newer save,
  // which names only that rank's files.
  const RankSet me{.legacy = false, .step = step, .files = {}};
  bool have_previous = false;
  for (size_t i = 0; collect && i < sets->size(); ++i) {
    const RankSet& set = (*sets)[i];
    const bool newer = set.NewerThan(me), mine = !newer && !me.NewerThan(set);
    if (newer || (!mine && !have_previous)) {
      auto complete = ReadCompleteRankSet(fs, dir, set);
      if (!complete.ok()) {
        collect = false;
        break;
      }
      if (*complete) {
        keep.merge(FileNames(**complete));
        if (!newer) have_previous = true;
        continue;
      }
      if (newer) {
        // Incomplete and newer (a save still running elsewhere): keep what its files name.
        for (const auto& [r, name] : set.files) {
          auto data = storage::ReadWholeFile(fs, storage::JoinPath(dir, name));
          auto part =
              data.ok() ? metadata::Decode(*data) : Result<metadata::Metadata>(data.status());
          if (part.ok())
            keep.merge(FileNames(*part));
          else if (part.status().code() != StatusCode::kNotFound)
            collect = false;
        }
        continue;
      }
    }
    if (mine) continue;
    if (auto it = set.files.find(rank); it != set.files.end()) drop.push_back(it->second);
  }
  if (collect) {
    for (const std::string& name : drop) (void)fs.Remove(storage::JoinPath(dir, name));
    CollectGarbage(fs, dir, keep, rank);
  }
  const auto t3 = Clock::now();
  result.plan_seconds = Seconds(t0, t1);
  result.write_seconds = Seconds(t1, t2);
  result.commit_seconds = Seconds(t2, t3);
  result.total_seconds = Seconds(t0, t3);
  return result;
}

// What every rank learned from the first exchange.
struct Hello {
  std::vector<uint64_t> hashes;          // per rank: its local plan's hash
  std::vector<uint64_t> cached_digests;  // per rank: its cached plan's digest (0: none)
  std::vector<uint64_t> values_hashes;   // per rank: ValuesHash of its state dict
  std::vector<uint64_t> base_hashes;     // per rank: BaseHash of its incremental base
  uint64_t save_id = 0;                  // rank 0's candidate: names this save's files
};

// The incremental base as every rank must name it (0: a full save).
uint64_t BaseHash(const std::string& base) {
  if (base.empty()) return 0;
  const std::string normal = storage::NormalPath(base);
  return Xxh3(std::as_bytes(std::span(normal.data(), normal.size()))) | 1;
}

// Agreement on (plan hash, cached plan, values hash, save id) in one all-gather, which also
// agrees on the failures of the local steps (`mine`).
Result<Hello> ExchangeHello(Comm& comm, const Status& mine, uint64_t local_hash,
                            uint64_t cached_digest, uint64_t values_hash, uint64_t my_id,
                            uint64_t base_hash, const std::string& dir, SaveResult* result) {
  std::string hello;
  {
    wire::Writer w(hello);
    w.Fixed64(local_hash);
    w.Fixed64(cached_digest);
    w.Fixed64(values_hash);
    w.Fixed64(my_id);
    w.Fixed64(base_hash);
  }
  DCP_CHECK(hello.size() == kSaveHelloBytes);
  DCP_ASSIGN_OR_RETURN(
      auto gathered,
      AllGatherOrFail(comm, mine.ok() ? OkStatus() : mine.Annotate("save to " + dir + ": "),
                      hello));
  Hello h;
  h.hashes.resize(comm.size());
  h.cached_digests.resize(comm.size());
  h.values_hashes.resize(comm.size());
  h.base_hashes.resize(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    result->plan_exchange_bytes += gathered[r].size();
    wire::Reader rd(gathered[r]);
    h.hashes[r] = rd.Fixed64();
    h.cached_digests[r] = rd.Fixed64();
    h.values_hashes[r] = rd.Fixed64();
    const uint64_t id = rd.Fixed64();
    h.base_hashes[r] = rd.Fixed64();
    if (r == 0) h.save_id = id;
  }
  return h;
}

// Every rank proves it sees the directory rank 0 locked (node-local disks, or a relative
// path resolved from different working directories, would scatter the checkpoint): no data
// is written until all do (rank 0 has only taken the lock and cleared files of dead saves in
// its own directory, which no committed metadata names).
Status CheckEveryRankSeesDirectory(Comm& comm, storage::FileSystem& fs, const std::string& dir,
                                   uint64_t save_id) {
  if (comm.size() == 1) return OkStatus();
  Status seen = comm.rank() == 0 ? OkStatus() : CheckSeesLock(fs, dir, save_id);
  DCP_ASSIGN_OR_RETURN(auto all, comm.AllGather(seen.ok() ? std::string() : seen.message()));
  std::string ranks, why;
  for (int r = 0; r < comm.size(); ++r) {
    if (all[r].empty()) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    why += (why.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + all[r]);
  }
  if (ranks.empty()) return OkStatus();
  return FailedPrecondition(
      "save: rank(s) " + ranks + " do not see the directory rank 0 writes to (" + why +
      "); every rank must see one shared directory (a shared file system and an absolute "
      "path); no data was written");
}

// The global plan over the distinct local plans, each sent once by its class's lowest rank.
Result<std::shared_ptr<const planner::GlobalSavePlan>> PlanGlobally(
    Comm& comm, const std::vector<uint64_t>& hashes, const std::string& encoded,
    const SaveOptions& opts, const std::string& dir, SaveResult* result,
    std::vector<std::string>* shared_values) {
  const planner::PlanClasses classes = planner::GroupByPlanHash(hashes);
  const auto& holders = classes.holders;
  DCP_ASSIGN_OR_RETURN(auto plans_raw,
                       comm.AllGather(classes.IsSender(comm.rank()) ? encoded : std::string()));
  for (const std::string& m : plans_raw) result->plan_exchange_bytes += m.size();
  std::vector<planner::LocalSavePlan> distinct(holders.size());
  for (size_t c = 0; c < holders.size(); ++c) {
    DCP_ASSIGN_OR_RETURN(distinct[c], planner::DecodeLocalPlan(plans_raw[holders[c].front()]));
  }
  *shared_values = SharedValueNames(distinct, holders);
  auto global = planner::PlanSave(distinct, holders, comm.size(),
                                  planner::SavePlanOptions{.balance = opts.dedup_replicas});
  if (!global.ok()) return global.status().Annotate("save to " + dir + ": ");
  return std::make_shared<const planner::GlobalSavePlan>(std::move(global).value());
}

// Rank 0 gathers the write results and commits the metadata; its verdict reaches every rank.
// On failure, when the save's metadata is not in place, every rank removes the files it
// wrote, so a failed save on a full disk frees the space it took. Returns the committed
// metadata on rank 0 (for the clean-up of older files), nullopt elsewhere.
Result<std::optional<metadata::Metadata>> CommitOnRankZero(Comm& comm, storage::FileSystem& fs,
                                                           const std::string& dir,
                                                           const planner::GlobalSavePlan& plan,
                                                           uint64_t save_id, const Status& wrote,
                                                           const Written& written) {
  const int rank = comm.rank(), world = comm.size();
  DCP_ASSIGN_OR_RETURN(auto results,
                       comm.Gather(wrote.ok() ? TagOk(EncodeWritten(written))
                                              : TagError(wrote.Annotate("save to " + dir + ": ")),
                                   0));
  Status commit;
  bool attempted = false;  // rank 0 tried to commit
  std::optional<metadata::Metadata> committed;
  if (rank == 0) {
    auto payloads = UntagAll(results);
    commit = payloads.status();
    std::vector<Written> all(world);
    for (int r = 0; r < world && commit.ok(); ++r) {
      auto w = DecodeWritten((*payloads)[r]);
      commit = w.status();
      if (w.ok()) all[r] = std::move(w).value();
    }
    if (commit.ok()) {
      auto md = BuildMetadata(plan, save_id, all, world);
      commit = md.status();
      if (md.ok()) {
        attempted = true;
        commit = CommitMetadata(fs, dir, *md);
      }
      if (commit.ok()) committed = std::move(md).value();
      if (!commit.ok()) commit = commit.Annotate("save to " + dir + ": commit: ");
    }
  }
  std::string verdict;
  if (rank == 0) {
    const bool disposable = !commit.ok() && (!attempted || FilesDisposable(fs, dir, save_id));
    verdict = std::string(1, disposable ? 'D' : 'K') + (commit.ok() ? TagOk("") : TagError(commit));
  }
  DCP_RETURN_IF_ERROR(comm.Broadcast(verdict, 0));
  if (verdict.size() < 2) return Internal("save to " + dir + ": empty commit verdict received");
  if (auto v = UntagAll({verdict.substr(1)}); !v.ok()) {
    if (verdict[0] == 'D') {
      (void)fs.Remove(storage::JoinPath(dir, DataFileName(save_id, rank)));
      (void)fs.Remove(storage::JoinPath(dir, BytesFileName(save_id, rank)));
    }
    return v.status();
  }
  return committed;
}

// Per-host directories: rank 0's committed metadata, written by the first rank of every other
// host into its own directory; agreed, so that every rank knows every host has it.
Status CopyMetadataToHosts(Comm& comm, storage::FileSystem& fs, const std::string& dir,
                           const std::optional<metadata::Metadata>& committed) {
  if (comm.size() == 1) return OkStatus();
  DCP_ASSIGN_OR_RETURN(auto hosts, comm.AllGather(HostName()));
  std::string encoded = committed ? metadata::Encode(*committed) : std::string();
  DCP_RETURN_IF_ERROR(comm.Broadcast(encoded, 0));
  const int me = comm.rank();
  const bool first_of_host = std::find(hosts.begin(), hosts.end(), hosts[me]) - hosts.begin() == me;
  Status st;
  if (me != 0 && first_of_host && hosts[me] != hosts[0]) {
    auto md = metadata::Decode(encoded);
    st = md.ok() ? CommitMetadata(fs, dir, *md) : md.status();
    if (!st.ok()) st = st.Annotate("save to " + dir + " (host " + hosts[me] + "): metadata: ");
  }
  return AgreeOnStatus(comm, st);
}

}  // namespace

void ClearSavePlanCache() { ProcessPlanCache().Clear(); }

Status JoinSaveAsFailed(const std::string& dir, const SaveOptions& opts, const Status& why) {
  DCP_CHECK(!why.ok());
  if (!opts.use_collectives || !opts.comm || opts.comm->size() == 1) {
    return why.Annotate("save to " + dir + ": ");
  }
  SaveResult ignored;
  auto hello = ExchangeHello(*opts.comm, why, 0, 0, 0, 0, 0, dir, &ignored);
  return hello.ok() ? Internal("save to " + dir + ": a failure was exchanged as a success")
                    : hello.status();
}

Result<SaveResult> Save(const StateDict& sd, const std::string& dir, const SaveOptions& opts,
                        storage::FileSystem& fs, const SaveHooks* hooks) {
  std::shared_ptr<Comm> comm = opts.comm ? opts.comm : LocalComm();
  const int rank = comm->rank(), world = comm->size();
  if (!opts.use_collectives) return SaveIndependently(sd, dir, rank, world, opts, fs, hooks);
  SaveResult result;
  const auto t0 = Clock::now();

  // 1. Local plan; rank 0 locks the directory (no other save may write into it until this
  //    one has committed or failed) and removes files of dead saves; then agreement on
  //    (plan hash, cached plan, values, save id) in one exchange, and proof that every rank
  //    sees the directory.
  auto local = Guarded("save plan: ", [&] { return planner::BuildLocalSavePlan(sd); });
  Status st = local.status();
  if (st.ok() && !opts.incremental_base.empty()) {
    st = opts.per_host_directory
             ? InvalidArgument("incremental saves into per-host directories are not supported")
             : CheckIncrementalBase(dir, opts.incremental_base);
  }
  // Rank 0 reads the base, before it creates or locks anything; every rank gets it below.
  std::string base_encoded;
  if (st.ok() && !opts.incremental_base.empty() && rank == 0) {
    auto b = ReadIncrementalBase(fs, opts.incremental_base);
    st = b.status();
    if (b.ok()) base_encoded = std::move(b).value();
  }
  const uint64_t my_id = RandomSaveId();
  storage::LeaseLock lock;                         // rank 0's; released on every return
  std::optional<std::vector<std::string>> listed;  // rank 0's, under the lock
  if (rank == 0) {
    if (st.ok()) st = fs.CreateDirs(dir);
    if (st.ok()) {
      st = LockForSave(lock, fs, dir, my_id,
                       {.lease_seconds = opts.lock_lease_seconds, .break_lock = opts.break_lock});
    }
    if (st.ok()) listed = RemoveFilesOfDeadSaves(fs, dir);
  } else if (opts.per_host_directory && st.ok()) {
    st = fs.CreateDirs(dir);
  }
  std::string encoded = st.ok() ? planner::EncodeLocalPlan(*local) : std::string();
  const uint64_t local_hash = planner::PlanHash(encoded);
  std::optional<CachedPlan> cached =
      opts.plan_cache ? ProcessPlanCache().Find(local_hash) : std::nullopt;
  DCP_ASSIGN_OR_RETURN(Hello hello,
                       ExchangeHello(*comm, st, local_hash, cached ? cached->digest : 0,
                                     ValuesHash(sd, cached ? cached->shared_values.get() : nullptr),
                                     my_id, BaseHash(opts.incremental_base), dir, &result));
  const uint64_t save_id = hello.save_id;
  // A cached plan is used when every rank has it for the same gathered hashes.
  const uint64_t digest =
      planner::DigestOfPlanHashes(hello.hashes) ^ (opts.dedup_replicas ? 0x9e3779b97f4a7c15ULL : 0);
  bool hit = true;
  for (uint64_t d : hello.cached_digests) hit = hit && d == digest;
  std::vector<std::string> differing;
  DCP_RETURN_IF_ERROR(CheckValuesAgree(*comm, sd, hello.values_hashes, hit, dir,
                                       &result.plan_exchange_bytes, &differing));
  if (!differing.empty()) {
    // Every rank's value of those names is kept under a name of its own: the save starts
    // over with them (their holders' plans change), rank 0 giving the directory's lock back.
    lock.Release();
    return Save(WithPerRankValues(sd, differing, rank), dir, opts, fs, hooks);
  }
  if (!opts.per_host_directory) {
    DCP_RETURN_IF_ERROR(CheckEveryRankSeesDirectory(*comm, fs, dir, save_id));
  }
  // The base, when every rank names the same one (rank 0 read it).
  std::optional<BaseChunks> base;
  for (int r = 1; r < world; ++r) {
    if (hello.base_hashes[r] != hello.base_hashes[0]) {
      return InvalidArgument("save to " + dir + ": ranks 0 and " + std::to_string(r) +
                             " name different incremental bases (every rank passes the same "
                             "SaveOptions::incremental_base)");
    }
  }
  if (hello.base_hashes[0] != 0) {
    DCP_RETURN_IF_ERROR(comm->Broadcast(base_encoded, 0));
    auto b = BaseChunks::Decode(base_encoded, dir, opts.incremental_base);
    DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, b.status()));
    base = std::move(b).value();
  }

  // 2. Global plan: from the cache on a hit, or from the distinct local plans.
  std::shared_ptr<const planner::GlobalSavePlan> plan;
  if (hit) {
    plan = cached->plan;
    result.plan_cache_hit = true;
  } else {
    auto shared = std::make_shared<std::vector<std::string>>();
    DCP_ASSIGN_OR_RETURN(plan,
                         PlanGlobally(*comm, hello.hashes, encoded, opts, dir, &result, &*shared));
    if (opts.plan_cache) ProcessPlanCache().Put(local_hash, {digest, plan, std::move(shared)});
  }
  result.unique_bytes = plan->unique_bytes;
  const auto t1 = Clock::now();

  // 3. Write this rank's items, durable, to new files (the previous checkpoint's files
  //    are never touched).
  Written written;
  st = Guarded("", [&] {
    return WriteMine(sd, dir, *plan, rank, save_id, opts, fs, base ? &*base : nullptr, &written,
                     &result);
  });
  // A lock broken while this save wrote (`dcp unlock`, a lease that ran out) belongs to
  // another save now: committing would mix two saves' files.
  if (rank == 0 && st.ok()) {
    st = lock.Check();
    if (!st.ok()) st = FailedPrecondition(st.message() + "; this save committed nothing");
  }
  // The caller's last word; its error reaches rank 0 with the write results, so nothing is
  // committed.
  if (st.ok() && hooks && hooks->before_commit) st = Guarded("", hooks->before_commit);
  const auto t2 = Clock::now();

  // 4. Results to rank 0, which commits the metadata; its verdict reaches everyone.
  DCP_ASSIGN_OR_RETURN(std::optional<metadata::Metadata> committed,
                       CommitOnRankZero(*comm, fs, dir, *plan, save_id, st, written));
  if (opts.per_host_directory) {
    DCP_RETURN_IF_ERROR(CopyMetadataToHosts(*comm, fs, dir, committed));
  }
  const auto t3 = Clock::now();
  // The checkpoint is committed and every rank knows it: removing the previous save's files
  // (slow on some file systems) no longer holds anyone up but rank 0.
  if (committed) CollectGarbage(fs, dir, FileNames(*committed), -1, listed ? &*listed : nullptr);
  result.plan_seconds = Seconds(t0, t1);
  result.write_seconds = Seconds(t1, t2);
  result.commit_seconds = Seconds(t2, t3);
  result.total_seconds = Seconds(t0, t3);
  if (LogEnabled()) {
    std::fprintf(stderr,
                 "dcp save %s rank %d/%d: plan %.3f s%s, write %.3f s, commit %.3f s, total "
                 "%.3f s; wrote %llu B in %llu items, %llu files\n",
                 dir.c_str(), rank, world, result.plan_seconds,
                 result.plan_cache_hit ? " (cache hit)" : "", result.write_seconds,
                 result.commit_seconds, result.total_seconds,
                 (unsigned long long)result.bytes_written, (unsigned long long)result.items_written,
                 (unsigned long long)result.files_written);
  }
  return result;
}

}  // namespace dcp::checkpoint
