// `dcp bench --phases tier`: the memory tier against the physical limits of the same run.
//
// A manager with a memory tier (under /dev/shm, replicas 1) on the bench's root: `repeat`
// async saves, each timed for how long it blocked the caller (against the same run's memcpy of
// the staged bytes) and until its replication finished; the bytes then in all hosts' memory
// (own files + replicas: 1 + replicas copies of the checkpoint). Then the last host's memory
// is removed before every restore -- a new manager and a load in the reshard layout, as a job
// restarted after losing that host would run -- from the tiers, then from the root alone
// (the page cache as --cache says, reads capped by --storage-gibps as every load of the
// bench).
#include <unistd.h>

#include <array>

#include "bench/runner.h"
#include "checkpoint/names.h"
#include "comm/host_id.h"
#include "dcp/manager.h"
#include "manager/manager.h"
#include "tier/memory_tier.h"
#include "tier/tier_plan.h"

namespace dcp::bench::internal {
Status Runner::RunTierPhase(PhaseReport* save, PhaseReport* from_memory, PhaseReport* from_root) {
  if (report_.object_store) {
    report_.notes.push_back("tier: skipped on object storage (run it on a file system root)");
    return OkStatus();
  }
  DCP_ASSIGN_OR_RETURN(auto names, comm_.AllGather(HostName()));
  const tier::Hosts hosts = tier::Hosts::From(names);
  const int host = hosts.host_of_rank[rank_];
  const bool first_of_host = hosts.ranks[host].front() == rank_;
  std::string base = o_.tier_dir + "/dcp-bench-tier-" + std::to_string(::getpid());
  DCP_RETURN_IF_ERROR(comm_.Broadcast(base, 0));
  const std::string root = ckpt_ + "-tier";
  DCP_RETURN_IF_ERROR(DeleteAndSettle(root));
  MemoryTierOptions t;
  t.dir = base;
  t.persist_every = 0;  // the root's copy is written once, after the timed saves
  t.persist_at_exit = false;
  report_.tier_hosts = hosts.size();
  report_.tier_replicas = std::min(t.replicas, hosts.size() - 1);
  report_.tier_host_lost = hosts.size() > 1;
  auto open = [&](bool with_tier, std::unique_ptr<CheckpointManager>* mgr) {
    ManagerOptions mo{.comm = comm_ptr_, .recycle_files = false};
    if (with_tier) mo.memory_tier = t;
    return AgreeOnStatus(comm_,
                         StatusOf([&] { *mgr = manager::NewManager(root, std::move(mo), *fs_); }));
  };
  const std::string my_tier = tier::HostTierDir(base, root);
  auto cleanup = [&] {
    std::error_code ec;
    if (first_of_host) std::filesystem::remove_all(my_tier, ec);
    (void)comm_.Barrier();
    if (rank_ == 0) std::filesystem::remove_all(base, ec);
  };

  std::unique_ptr<CheckpointManager> mgr;
  Status st = open(true, &mgr);
  if (st.ok()) {
    st = AgreeOnStatus(comm_, StatusOf([&] { mgr->PrepareAsyncSave(source_.sd); }));
  }
  for (int i = 1; st.ok() && i <= o_.repeat; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.pause_seconds));
    auto blocked = Timed([&] { return StatusOf([&] { mgr->AsyncSave(i, source_.sd); }); });
    if (!(st = blocked.status()).ok()) break;
    auto replicated = Timed([&] { return StatusOf([&] { mgr->Wait(); }); });
    if (!(st = replicated.status()).ok()) break;
    save->blocked_seconds.push_back(*blocked);
    save->seconds.push_back(*blocked + *replicated);
    auto copy = MemcpyStagedBytes();
    if (!(st = copy.status()).ok()) break;
    save->memcpy_seconds.push_back(*copy);
  }
  if (st.ok()) {
    // The data files of the last step in this host's memory (`dcp ls --memory-tier`'s view).
    uint64_t mine = 0;
    st = AgreeOnStatus(comm_, StatusOf([&] {
                         if (!first_of_host) return;
                         for (const MemoryStepInfo& m : inspect_memory_tier(root, base).steps) {
                           if (m.step == o_.repeat) mine = m.bytes;
                         }
                       }));
    auto sums = SumAtRoot(comm_, {mine});
    if (st.ok()) st = sums.status();
    if (st.ok() && rank_ == 0) report_.tier_bytes_in_memory = (*sums)[0];
  }
  // The root's copy of the last step, for the restore from the root.
  if (st.ok()) st = AgreeOnStatus(comm_, StatusOf([&] { mgr->Persist(); }));
  mgr.reset();

  const std::string step_dir = root + "/" + checkpoint::StepDirName(o_.repeat);
  for (int rep = 0; st.ok() && rep < o_.repeat; ++rep) {
    // Alternating which goes first: the second load of a repetition finds the first one's
    // freed memory already faulted in, which would favour one side.
    const std::array<PhaseReport*, 2> order =
        rep % 2 == 0 ? std::array{from_memory, from_root} : std::array{from_root, from_memory};
    for (PhaseReport* p : order) {
      // The last host lost its memory (it held what the restore before fetched, too).
      if (report_.tier_host_lost && host == hosts.size() - 1 && first_of_host) {
        std::error_code ec;
        std::filesystem::remove_all(my_tier, ec);
      }
      auto dst = workload::MakeEmptyLike(model_, load_layout_, rank_);
      if (!(st = AgreeOnStatus(comm_, dst.status())).ok()) break;
      auto resident = PrepareCache(step_dir, o_.cold);
      if (!(st = resident.status()).ok()) break;
      LoadResult r;
      auto s = Timed([&] {
        std::unique_ptr<CheckpointManager> m;
        DCP_RETURN_IF_ERROR(open(p == from_memory, &m));
        return StatusOf([&] { r = m->Load(dst->sd); });
      });
      if (!(st = s.status()).ok()) break;
      Took(p, *s);
      if (p == from_memory && !r.from_memory) {
        st = AgreeOnStatus(comm_, Internal("bench: tier: the restore did not come from memory"));
        break;
      }
      auto sums =
          SumAtRoot(comm_, {r.bytes_read, r.files_from_peers, r.files_from_storage, r.bytes_sent});
      if (!(st = sums.status()).ok()) break;
      if (rank_ == 0) {
        p->bytes_read_storage = (*sums)[0];
        p->files_opened = (*sums)[1] + (*sums)[2];
        p->bytes_sent = (*sums)[3];
      }
      if (rep == 0 && o_.verify) {
        st = AgreeOnStatus(comm_,
                           workload::VerifyStateDict(dst->sd).Annotate("bench: " + p->name + ": "));
        if (!st.ok()) break;
      }
    }
  }
  cleanup();
  return st;
}

}  // namespace dcp::bench::internal
