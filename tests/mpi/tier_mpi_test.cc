// The memory tier with real processes: one job of the scenarios tier_test.sh runs under
// mpirun, each rank on an emulated host (DCP_HOST_ID), the hosts' tiers in directories of
// their own under TIER (removing one is losing that host's memory).
//
//   tier_mpi_test save ROOT TIER LAYOUT STEPS [options]     saves STEPS more steps after the
//                                                           newest the manager finds
//   tier_mpi_test restore ROOT TIER LAYOUT [options]        loads the newest step and checks it
// options: --persist-every N  --no-persist-at-exit  --async  --die-after-ms MS (every rank is
//          SIGKILLed then)  --expect-step S  --expect-at-least S  --expect-memory yes|no
//          --expect-no-storage (restore: no file copied from the root)
//          --incremental (the root's saves are incremental and the experts' weights stay
//          frozen, in both modes; a save job then verifies every root step and prints
//          "referencing N": the root steps that reference a base)
//
// Each step's tensors are the workload's pattern XORed with the step number, and a bytes entry
// holds the step: a load that mixed steps, or took one copy for another, fails the check.
// Rank 0 prints "saved S" once save S is complete (memory-complete with a tier), and
// "restored S from memory|root: files from peers P, from storage F" after a checked load.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "dcp/checkpoint.h"
#include "dcp/manager.h"
#include "dcp/mpi_comm.h"
#include "workload/layout_spec.h"
#include "workload/model.h"
#include "workload/populate.h"

namespace {

struct Args {
  std::string mode, root, tier, layout;
  int64_t steps = 0;
  int64_t persist_every = 1;
  bool persist_at_exit = true;
  bool async = false;
  int die_after_ms = -1;
  int64_t expect_step = -1, expect_at_least = -1;
  std::string expect_memory;
  bool expect_no_storage = false;
  bool incremental = false;
};

[[noreturn]] void Fail(int rank, const std::string& why) {
  std::fprintf(stderr, "tier_mpi_test rank %d: FAIL: %s\n", rank, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// Every tensor but the frozen ones (with --incremental: the experts', most of the bytes).
void XorStep(dcp::workload::OwnedStateDict& owned, int64_t step, bool frozen_experts) {
  const auto x = static_cast<std::byte>(step & 0xff);
  for (const auto& e : owned.sd.entries()) {
    if (e.kind != dcp::StateEntry::Kind::kTensor) continue;
    if (frozen_experts && e.fqn.find("experts") != std::string::npos) continue;
    for (const auto& c : e.chunks) {
      const uint64_t n = *dcp::DTypeBytes(e.dtype, c.box.NumElements());
      for (uint64_t i = 0; i < n; ++i) c.view.bytes()[i] ^= x;
    }
  }
}

uint64_t Sum(dcp::Comm& comm, uint64_t v) {
  auto all = comm.AllGather(std::to_string(v));
  uint64_t total = 0;
  for (const auto& s : *all) total += std::stoull(s);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  dcp::EnsureMpiInitialized(&argc, &argv);
  auto world = dcp::MpiComm(MPI_COMM_WORLD);
  world->set_timeout(std::chrono::seconds(240));
  const int rank = world->rank();
  Args a;
  if (argc < 5) Fail(rank, "usage: tier_mpi_test save|restore ROOT TIER LAYOUT ...");
  a.mode = argv[1];
  a.root = argv[2];
  a.tier = argv[3];
  a.layout = argv[4];
  int i = 5;
  if (a.mode == "save") {
    if (argc < 6) Fail(rank, "save needs STEPS");
    a.steps = std::atoll(argv[i++]);
  }
  for (; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) Fail(rank, f + " needs a value");
      return std::string(argv[++i]);
    };
    if (f == "--persist-every")
      a.persist_every = std::atoll(next().c_str());
    else if (f == "--no-persist-at-exit")
      a.persist_at_exit = false;
    else if (f == "--async")
      a.async = true;
    else if (f == "--die-after-ms")
      a.die_after_ms = std::atoi(next().c_str());
    else if (f == "--expect-step")
      a.expect_step = std::atoll(next().c_str());
    else if (f == "--expect-at-least")
      a.expect_at_least = std::atoll(next().c_str());
    else if (f == "--expect-memory")
      a.expect_memory = next();
    else if (f == "--expect-no-storage")
      a.expect_no_storage = true;
    else if (f == "--incremental")
      a.incremental = true;
    else
      Fail(rank, "unknown flag " + f);
  }
  if (a.die_after_ms >= 0) {
    std::thread([ms = a.die_after_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      ::kill(::getpid(), SIGKILL);
    }).detach();
  }

  auto model = dcp::workload::MakeModel("qwen3-30b-a3b", 2, 1.0 / 16);
  auto layout = dcp::workload::ParseLayout(a.layout);
  if (!model.ok() || !layout.ok()) Fail(rank, "bad model or layout " + a.layout);
  if (layout->WorldSize() != world->size())
    Fail(rank, "layout " + a.layout + " is not of this world size");

  dcp::ManagerOptions opts;
  opts.comm = world;
  opts.policy.keep_last = 2;
  opts.incremental = a.incremental;
  dcp::MemoryTierOptions tier;
  tier.dir = a.tier;
  tier.persist_every = a.persist_every;
  tier.persist_at_exit = a.persist_at_exit;
  opts.memory_tier = tier;
  // A restart that lost host h0 finds its manager lock (rank 0 was there): it is broken once
  // its lease runs out unrenewed, as after a real node failure. Short here, so the test waits
  // seconds, not minutes; every rank sees the same refusal and tries again alike.
  opts.lock_lease_seconds = 2;
  try {
    std::unique_ptr<dcp::CheckpointManager> opened;
    for (int attempt = 0; !opened; ++attempt) {
      try {
        opened = std::make_unique<dcp::CheckpointManager>(a.root, opts);
      } catch (const dcp::Error& e) {
        if (e.code() != dcp::StatusCode::kFailedPrecondition || attempt >= 240) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
    dcp::CheckpointManager& mgr = *opened;
    if (a.mode == "save") {
      const int64_t first = mgr.latest_step().value_or(0) + 1;
      auto owned = dcp::workload::PopulateStateDict(*model, *layout, rank);
      if (!owned.ok()) Fail(rank, owned.status().ToString());
      owned->sd.add_bytes("train/step", std::to_string(first));
      int64_t prev = 0;
      for (int64_t s = first; s < first + a.steps; ++s) {
        XorStep(*owned, prev ^ s, a.incremental);  // the pattern XOR s
        prev = s;
        owned->sd.add_bytes("train/step", std::to_string(s));
        if (a.async) {
          mgr.AsyncSave(s, owned->sd);
          // The step before is complete once AsyncSave returned (it finished that one).
          if (rank == 0 && s > first) std::printf("saved %lld\n", static_cast<long long>(s - 1));
        } else {
          mgr.Save(s, owned->sd);
          if (rank == 0) std::printf("saved %lld\n", static_cast<long long>(s));
        }
        std::fflush(stdout);
      }
      mgr.Wait();
      if (rank == 0 && a.async) std::printf("saved %lld\n", static_cast<long long>(prev));
      if (rank == 0 && a.incremental) {
        int referencing = 0;
        for (int64_t s : mgr.steps()) {
          dcp::verify(mgr.step_dir(s));  // every byte, the referenced ones included
          const dcp::Metadata md = dcp::read_metadata(mgr.step_dir(s));
          for (const auto& f : md.files) {
            if (!f.base.empty()) {
              ++referencing;
              break;
            }
          }
        }
        std::printf("referencing %d\n", referencing);
      }
      std::fflush(stdout);
    } else {
      auto owned = dcp::workload::MakeEmptyLike(*model, *layout, rank);
      if (!owned.ok()) Fail(rank, owned.status().ToString());
      owned->sd.add_bytes("train/step");
      dcp::LoadResult r = mgr.Load(owned->sd);
      const auto* e = owned->sd.find("train/step");
      const std::string text(reinterpret_cast<const char*>(e->bytes.data()), e->bytes.size());
      if (text != std::to_string(r.step))
        Fail(rank, "step entry says " + text + ", load says " + std::to_string(r.step));
      XorStep(*owned, r.step, a.incremental);
      if (auto v = dcp::workload::VerifyStateDict(owned->sd); !v.ok()) {
        Fail(rank, "step " + std::to_string(r.step) + " loaded wrong data: " + v.ToString());
      }
      const uint64_t peers = Sum(*world, r.files_from_peers);
      const uint64_t storage = Sum(*world, r.files_from_storage);
      // Every rank holds the same account of damaged copies.
      std::string damaged;
      for (const std::string& line : r.damaged_copies) damaged += line + "\n";
      for (int other = 0; other < world->size(); ++other) {
        std::string theirs = damaged;
        if (!world->Broadcast(theirs, other).ok() || theirs != damaged) {
          Fail(rank, "ranks disagree on the damaged copies:\n" + damaged + "--\n" + theirs);
        }
      }
      for (const std::string& line : r.damaged_copies) {
        std::printf("rank %d: damaged copy: %s\n", rank, line.c_str());
      }
      std::fflush(stdout);
      if (rank == 0) {
        std::printf("restored %lld from %s: files from peers %llu, from storage %llu%s%s\n",
                    static_cast<long long>(r.step), r.from_memory ? "memory" : "root",
                    static_cast<unsigned long long>(peers),
                    static_cast<unsigned long long>(storage),
                    r.fell_back.empty() ? "" : "; fell back: ", r.fell_back.c_str());
        std::fflush(stdout);
      }
      if (a.expect_step >= 0 && r.step != a.expect_step) {
        Fail(rank, "restored step " + std::to_string(r.step) + ", expected " +
                       std::to_string(a.expect_step));
      }
      if (a.expect_at_least >= 0 && r.step < a.expect_at_least) {
        Fail(rank, "restored step " + std::to_string(r.step) + ", but step " +
                       std::to_string(a.expect_at_least) + " was complete: lost");
      }
      if (!a.expect_memory.empty() && r.from_memory != (a.expect_memory == "yes")) {
        Fail(rank, std::string("restored from ") + (r.from_memory ? "memory" : "the root"));
      }
      if (a.expect_no_storage && storage != 0) {
        Fail(rank, std::to_string(storage) + " files were copied from the root");
      }
    }
  } catch (const std::exception& e) {
    Fail(rank, e.what());
  }
  return 0;
}
