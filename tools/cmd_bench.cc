// dcp bench: save/load phases of a synthetic workload against the physical limits of the
// same directory, measured in the same run (src/bench/bench.h).
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench/bench.h"
#include "tools/commands.h"
#include "tools/workload_flags.h"
#include "tools/world.h"

namespace dcp::tools {
namespace {

struct BenchArgs {
  bench::BenchOptions opts;
  std::string phases = "save,load,reshard";
  std::string cache = "cold";
  std::string json;
};

int RunBenchCommand(BenchArgs a) {
  a.opts.phases.clear();
  std::stringstream ss(a.phases);
  for (std::string p; std::getline(ss, p, ',');) {
    if (!p.empty()) a.opts.phases.push_back(p);
  }
  if (a.cache != "cold" && a.cache != "warm") {
    throw Error(InvalidArgument("--cache must be cold or warm, got '" + a.cache + "'"));
  }
  a.opts.cold = a.cache == "cold";
  std::shared_ptr<Comm> comm = WorldComm();
  if (comm->rank() == 0 && a.opts.storage_gibps > 0) {
    std::cout << "dcp bench: EMULATED SLOW STORAGE: reads capped at " << a.opts.storage_gibps
              << " GiB/s in aggregate" << std::endl;
  }
  auto report = bench::RunBench(comm, a.opts);
  if (!report.ok()) throw Error(report.status());
  if (comm->rank() != 0) return 0;
  std::cout << bench::FormatTable(*report) << std::flush;
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << bench::ReportJson(*report);
    out.close();
    if (!out) throw Error(Unavailable("cannot write " + a.json));
    std::cout << "wrote " << a.json << std::endl;
  }
  return 0;
}

}  // namespace

void AddBench(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "bench", "Time save/load phases against the physical limits measured in the same run");
  auto a = std::make_shared<BenchArgs>();
  bench::BenchOptions& o = a->opts;
  AddWorkloadFlags(cmd, &o.workload, "e.g. dp4, tp2,dp2 (default dp<ranks>)",
                   "reshard phase layout (default tp<ranks>)");
  cmd->add_option("--phases", a->phases,
                  "comma-separated: save, load, reshard, async, manager, tier, incremental")
      ->capture_default_str();
  cmd->add_option("--cache", a->cache, "cold (dropped, checked with mincore) or warm (just read)")
      ->capture_default_str();
  cmd->add_option("--repeat", o.repeat, "repetitions; medians are reported")->capture_default_str();
  cmd->add_option("--dir", o.dir, "scratch directory (emptied; default under the temp dir)");
  cmd->add_option("--storage-gibps", o.storage_gibps,
                  "emulate slow shared storage: cap reads at this aggregate GiB/s");
  cmd->add_option("--tier-dir", o.tier_dir, "tier phase: the tmpfs the hosts' memory tier lives in")
      ->capture_default_str();
  cmd->add_option("--incremental-changed", o.incremental_changed,
                  "incremental phase: fraction of the bytes trained between the two saves")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--pause", o.pause_seconds, "seconds to settle after delete + sync")
      ->capture_default_str();
  cmd->add_flag("!--no-verify", o.verify, "skip checking every loaded byte");
  cmd->add_option("--max-broadcast-buffer-mib", o.load_max_broadcast_buffer_mib,
                  "loads: LoadOptions::max_broadcast_buffer_bytes in MiB (default 256)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("!--no-async-prepare", o.async_prepare,
                "async: no AsyncSaver::Prepare, the first save allocates its staging pool");
  cmd->add_option("--json", a->json, "write the report as JSON (schema: docs/benchmarks.md)");
  cmd->callback([=] { *exit_code = RunBenchCommand(*a); });
}

}  // namespace dcp::tools
