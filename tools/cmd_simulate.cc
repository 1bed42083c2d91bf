// dcp simulate: plan a whole job of N ranks in one process, no tensor data
// (src/simulate/simulate.h).
#include <fstream>
#include <iostream>

#include "simulate/simulate.h"
#include "tools/commands.h"

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
  cmd->add_option("--model,--workload", o.model, "qwen3-30b-a3b, llama-dense or dense-500b")
      ->capture_default_str();
  cmd->add_option("--layers", o.layers, "transformer layers")->capture_default_str();
  cmd->add_option("--width-scale", o.width_scale, "shrink widths, keep the tensor count")
      ->capture_default_str();
  cmd->add_flag("--optimizer", o.optimizer, "add fp32 exp_avg and exp_avg_sq per parameter");
  cmd->add_option("--ranks", o.ranks, "world size")->required();
  cmd->add_option("--save-layout", o.save_layout, "e.g. tp8,ep8,dp256 (default dp<ranks>)");
  cmd->add_option("--load-layout", o.load_layout, "default: the save layout");
  cmd->add_option("--ranks-per-host", o.ranks_per_host,
                  "ranks sharing a host and its page cache (no broadcast among them)")
      ->capture_default_str();
  cmd->add_flag("--check-classes", o.check_classes,
                "also plan every rank and check the plan classes (slow at scale)");
  cmd->add_option("--json", a->json, "write the report as JSON to this file ('-': stdout only)");
  cmd->callback([=] { *exit_code = RunSimulate(*a); });
}

}  // namespace dcp::tools
