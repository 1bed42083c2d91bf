#include <iostream>
#include <string>

#include "dcp/status.h"
#include "tools/commands.h"
#include "tools/world.h"

int main(int argc, char** argv) {
  CLI::App app{"dcp: distributed checkpoints for large-model training"};
  app.require_subcommand(1);
  int exit_code = 0;
  dcp::tools::AddInspect(app, &exit_code);
  dcp::tools::AddVerify(app, &exit_code);
  dcp::tools::AddDemo(app, &exit_code);
  dcp::tools::AddConvert(app, &exit_code);
  dcp::tools::AddBench(app, &exit_code);
  dcp::tools::AddSimulate(app, &exit_code);
  dcp::tools::AddLs(app, &exit_code);
  dcp::tools::AddPrune(app, &exit_code);
  dcp::tools::AddUnlock(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dcp::Error& e) {
    // An error every rank agreed on is printed once, by rank 0; the others exit with the same
    // code. An error local to a rank (a timeout, say) is printed by that rank.
    if (e.agreed() && dcp::tools::WorldRank() != 0) return 1;
    // "dcp verify: ..." : the library's one sentence, under the command that failed.
    std::string cmd = "dcp";
    for (const CLI::App* sub : app.get_subcommands()) cmd += " " + sub->get_name();
    std::cerr << cmd << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "dcp: unexpected error: " << e.what() << "\n";
    return 2;
  }
  return exit_code;
}
