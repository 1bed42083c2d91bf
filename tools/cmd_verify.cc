// dcp verify CKPT: every file present and complete, every checksum.
#include <cstdio>
#include <iostream>

#include "dcp/checkpoint.h"
#include "dcp/format.h"
#include "tools/commands.h"

namespace dcp::tools {

void AddVerify(CLI::App& app, int* /*exit_code: errors are thrown*/) {
  auto* cmd =
      app.add_subcommand("verify", "Check every data file and every checksum of a checkpoint");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("checkpoint", *dir, "checkpoint directory")->required();
  cmd->callback([=] {
    const VerifyResult report = verify(*dir);
    if (!report.has_checksums) {
      // HuggingFace safetensors carry no checksums: say so rather than print "0 B checked".
      std::printf(
          "OK: %s: %llu tensors, %llu files, HuggingFace source: no checksums, sizes checked "
          "in %.2f s\n",
          dir->c_str(), (unsigned long long)report.tensors, (unsigned long long)report.files,
          report.seconds);
      return;
    }
    std::printf(
        "OK: %s: %llu tensors, %llu chunks, %llu bytes entries, %llu files, %s checked in %.2f s\n",
        dir->c_str(), (unsigned long long)report.tensors, (unsigned long long)report.chunks,
        (unsigned long long)report.bytes_entries, (unsigned long long)report.files,
        HumanBytes(report.bytes_checked).c_str(), report.seconds);
  });
}

}  // namespace dcp::tools
