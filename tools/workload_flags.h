// The workload flags of `dcp bench`, `dcp simulate` and `dcp demo`, declared once.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "workload/workload.h"

namespace dcp::tools {

// --model (alias --workload), --layers, --width-scale, --optimizer, --save-layout,
// --load-layout into `o`, whose current values are the defaults shown in --help.
void AddWorkloadFlags(CLI::App* cmd, workload::WorkloadOptions* o, const std::string& save_help,
                      const std::string& load_help);

}  // namespace dcp::tools
