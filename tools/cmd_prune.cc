// dcp prune ROOT --keep-last K [--keep-every M] [--dry-run]: applies a retention policy to a
// checkpoint manager's root, through the manager (its lock, its rules: only steps older than
// the newest complete one go, metadata first).
#include <cstdio>

#include "dcp/manager.h"
#include "tools/commands.h"

namespace dcp::tools {

void AddPrune(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "prune", "Remove the steps a retention policy does not keep (and incomplete steps)");
  struct Args {
    std::string root;
    int64_t keep_last = 0;
    int64_t keep_every = 0;
    bool dry_run = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("root", a->root, "the manager's root directory")->required();
  cmd->add_option("--keep-last", a->keep_last, "keep the K newest complete steps")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--keep-every", a->keep_every, "also keep the steps that are multiples of M")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--dry-run", a->dry_run, "print what would be removed; change nothing");
  cmd->callback([=] {
    RetentionPolicy p;
    p.keep_last = a->keep_last;
    if (a->keep_every > 0) p.keep_every = a->keep_every;
    std::vector<int64_t> removed;
    if (a->dry_run) {
      // Read-only: no lock, no clean-up of incomplete directories.
      const RootInfo info = inspect_root(a->root);
      removed = StepsToRemove(info.complete_steps(), info.latest, p, {}, info.bases());
    } else {
      CheckpointManager mgr(a->root, p);  // refused while a job holds the root
      removed = mgr.Prune();
    }
    for (int64_t s : removed) {
      std::printf("%s %s\n", a->dry_run ? "would remove" : "removed", StepDirName(s).c_str());
    }
    std::printf("%s %zu step%s\n", a->dry_run ? "would remove" : "removed", removed.size(),
                removed.size() == 1 ? "" : "s");
    *exit_code = 0;
  });
}

}  // namespace dcp::tools
