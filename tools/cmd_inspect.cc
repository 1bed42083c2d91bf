// dcp inspect CKPT [--json] [--chunks]
#include <iostream>

#include "dcp/checkpoint.h"
#include "tools/commands.h"

namespace dcp::tools {

void AddInspect(CLI::App& app, int* /*exit_code: errors are thrown*/) {
  auto* cmd =
      app.add_subcommand("inspect", "Describe a checkpoint: tensors, chunks, files, totals");
  auto dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto chunks = std::make_shared<bool>(false);
  cmd->add_option("checkpoint", *dir, "checkpoint directory")->required();
  cmd->add_flag("--json", *json, "machine-readable output (schema in docs/format.md)");
  cmd->add_flag("--chunks", *chunks, "list every chunk (text output)");
  cmd->callback([=] {
    const Metadata md = read_metadata(*dir);
    if (*json) {
      std::cout << MetadataToJson(md) << "\n";
    } else {
      std::cout << MetadataSummary(md, *chunks);
    }
  });
}

}  // namespace dcp::tools
