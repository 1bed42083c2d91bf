#include <cstdio>
#include <numeric>

#include "checkpoint/save.h"
#include "comm/exchange.h"
#include "manager/manager_impl.h"

namespace dcp {

namespace {

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

}  // namespace

SaveOptions CheckpointManager::Impl::TierSaveOptions() const {
  SaveOptions o = opts.save;
  o.per_host_directory = true;
  o.recycle_dir.clear();
  return o;
}

bool CheckpointManager::Impl::TierTakes(int64_t step, const StateDict& sd, bool retain_now) {
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

tier::DurableSteps CheckpointManager::Impl::Durable() const {
  return {std::set<int64_t>(steps.begin(), steps.end()), [this](int64_t s) { return Dir(s); }, &fs,
          referencing};
}

TierOutcome CheckpointManager::Impl::RunTierSteps(Comm& c, tier::PairGroups& groups, int64_t step,
                                                  const Status& saved, const std::string& base) {
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

void CheckpointManager::Impl::ForgetMemoryStepsAbove(int64_t loaded, const std::string& why) {
  std::vector<int64_t> passed;
  for (int64_t s : memory_steps) {
    if (s > loaded) passed.push_back(s);
  }
  if (passed.empty()) return;
  tier->MarkPassedOver(passed, why.empty() ? "passed over by a restore" : why);
  std::erase_if(memory_steps, [&](int64_t s) { return s > loaded; });
  for (int64_t s : passed) saved_in_memory.erase(s);
}

void CheckpointManager::Impl::FinalizeTier(int64_t step, const TierOutcome& o) {
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

void CheckpointManager::Impl::EnsureBackgroundComm() {
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

void CheckpointManager::Impl::Persist() {
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

}  // namespace dcp
