// dcp ls ROOT: the steps under a checkpoint manager's root -- size, complete or not, which one
// a resume loads -- and what retention would remove under --keep-last / --keep-every.
#include <cstdio>
#include <optional>

#include "dcp/format.h"
#include "dcp/manager.h"
#include "tools/commands.h"

namespace dcp::tools {
namespace {

std::string JoinSteps(const std::vector<int64_t>& steps) {
  std::string out;
  for (int64_t s : steps) out += (out.empty() ? "" : " ") + std::to_string(s);
  return out.empty() ? "nothing" : out;
}

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out.empty() ? "-" : out;
}

void PrintMemoryTier(const std::string& root, const std::string& tier_dir) {
  const HostTierInfo t = inspect_memory_tier(root, tier_dir);
  std::printf("memory tier of this host: %s\n", t.dir.c_str());
  std::printf("%-14s %12s  %-9s %s\n", "STEP", "SIZE", "FILES",
              "WRITERS (ranks whose files are here)");
  for (const MemoryStepInfo& s : t.steps) {
    const std::string files =
        std::to_string(s.files) + "/" + (s.has_metadata ? std::to_string(s.files_named) : "?");
    std::printf("%-14lld %12s  %-9s %s%s\n", static_cast<long long>(s.step),
                HumanBytes(s.bytes).c_str(), files.c_str(), JoinRanks(s.writers).c_str(),
                s.has_metadata ? "" : " (no metadata here)");
  }
  std::printf(
      "%zu steps in this host's memory; a step is restorable when the hosts' files "
      "together cover it (a job's restore decides)\n",
      t.steps.size());
}

}  // namespace

void AddLs(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "ls", "List the steps under a checkpoint manager's root, and what retention would remove");
  struct Args {
    std::string root;
    int64_t keep_last = 0;
    int64_t keep_every = 0;
    std::string memory_tier;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("root", a->root, "the manager's root directory")->required();
  cmd->add_option("--keep-last", a->keep_last, "retention to preview: keep the K newest steps")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--keep-every", a->keep_every, "retention to preview: keep multiples of M")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--memory-tier", a->memory_tier,
                  "also list what this host's memory tier under DIR holds of the root "
                  "(MemoryTierOptions::dir, e.g. /dev/shm/dcp-tier)");
  cmd->callback([=] {
    const RootInfo info = inspect_root(a->root);
    std::printf("%-14s %12s  %s\n", "STEP", "SIZE", "STATE");
    const std::vector<int64_t> complete = info.complete_steps();
    uint64_t total = 0;
    for (const StepInfo& s : info.steps) {
      total += s.bytes;
      std::string state = s.complete ? "complete" : "INCOMPLETE: " + s.problem;
      if (s.complete && info.latest == s.step) state += " (latest: a resume loads it)";
      // Incremental steps: what each references, and which steps keep it as their base.
      if (!s.bases.empty()) state += "; references " + JoinSteps(s.bases);
      if (!s.referenced_by.empty()) state += "; base of " + JoinSteps(s.referenced_by);
      std::printf("%-14lld %12s  %s\n", static_cast<long long>(s.step), HumanBytes(s.bytes).c_str(),
                  state.c_str());
    }
    std::printf("%zu steps, %zu complete, %s\n", info.steps.size(), complete.size(),
                HumanBytes(total).c_str());
    if (info.recycle_files > 0) {
      std::printf("recycle pool: %llu retired data files, %s (the next save overwrites them)\n",
                  static_cast<unsigned long long>(info.recycle_files),
                  HumanBytes(info.recycle_bytes).c_str());
    }
    if (info.latest_record) {
      std::printf(
          "latest record: %lld%s\n", static_cast<long long>(*info.latest_record),
          info.latest_record == info.latest ? "" : " (stale: the newest complete step wins)");
    } else {
      std::printf("latest record: none\n");
    }
    if (a->keep_last > 0 || a->keep_every > 0) {
      RetentionPolicy p;
      if (a->keep_last > 0) p.keep_last = a->keep_last;
      if (a->keep_every > 0) p.keep_every = a->keep_every;
      std::printf("retention would remove: %s\n",
                  JoinSteps(StepsToRemove(complete, info.latest, p, {}, info.bases())).c_str());
    }
    if (!a->memory_tier.empty()) PrintMemoryTier(a->root, a->memory_tier);
    *exit_code = 0;
  });
}

}  // namespace dcp::tools
