// The `dcp` command-line tool: thin commands over library calls, one file each.
#pragma once

#include <CLI/CLI.hpp>

namespace dcp::tools {

// Each adds its subcommand to `app`; the callback runs the command and sets *exit_code.
void AddInspect(CLI::App& app, int* exit_code);
void AddVerify(CLI::App& app, int* exit_code);
void AddDemo(CLI::App& app, int* exit_code);
void AddConvert(CLI::App& app, int* exit_code);
void AddBench(CLI::App& app, int* exit_code);
void AddSimulate(CLI::App& app, int* exit_code);
void AddLs(CLI::App& app, int* exit_code);
void AddPrune(CLI::App& app, int* exit_code);
void AddUnlock(CLI::App& app, int* exit_code);

}  // namespace dcp::tools
