// dcp simulate: plan a whole job of N ranks in one process, no tensor data
// (src/simulate/simulate.h).
#include <fstream>
#include <iostream>

#include "simulate/simulate.h"
#include "tools/commands.h"
#include "tools/workload_flags.h"

namespace dcp::tools {
namespace {

struct SimulateArgs {
  simulate::SimulateOptions opts;
  std::string json;  // "-" for stdout
};

int RunSimulate(const SimulateArgs& a) {
  auto report = simulate::Simulate(a.opts);
  if (!report.ok()) throw Error(report.status());
  if (a.json == "-") {
    std::cout << simulate::ReportJson(*report);
    return 0;
  }
  std::cout << simulate::FormatReport(*report) << std::flush;
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << simulate::ReportJson(*report);
    out.close();
    if (!out) throw Error(Unavailable("cannot write " + a.json));
  }
  return 0;
}

}  // namespace

void AddSimulate(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("simulate", "Plan a job of N ranks in one process, no data");
  auto a = std::make_shared<SimulateArgs>();
  simulate::SimulateOptions& o = a->opts;
  AddWorkloadFlags(cmd, &o.workload, "e.g. tp8,ep8,dp256 (default dp<ranks>)",
                   "default: the save layout");
  cmd->add_option("--ranks", o.ranks, "world size of the load (the save layout may have another)")
      ->required();
  cmd->add_option("--ranks-per-host", o.ranks_per_host,
                  "ranks sharing a host and its page cache (no broadcast among them)")
      ->capture_default_str();
  cmd->add_flag("--check-classes", o.check_classes,
                "also plan every rank and check the plan classes (slow at scale)");
  cmd->add_option("--json", a->json, "write the report as JSON to this file ('-': stdout only)");
  cmd->callback([=] { *exit_code = RunSimulate(*a); });
}

}  // namespace dcp::tools
