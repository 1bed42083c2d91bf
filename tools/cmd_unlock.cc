// dcp unlock PATH: removes the lock of a manager's root or of a checkpoint directory whose
// job is gone (the library breaks a lock by itself once its holder's lease runs out).
#include <cstdio>

#include "dcp/manager.h"
#include "tools/commands.h"

namespace dcp::tools {

void AddUnlock(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "unlock", "Remove the lock of a root or checkpoint directory whose job is gone");
  auto path = std::make_shared<std::string>();
  cmd->add_option("path", *path, "a manager's root or a checkpoint directory")->required();
  cmd->callback([=] {
    for (const std::string& line : unlock(*path)) std::printf("removed %s\n", line.c_str());
    *exit_code = 0;
  });
}

}  // namespace dcp::tools
