// The synthetic workload that `dcp bench`, `dcp simulate` and `dcp demo` share: a real model's
// tensors (widths scaled, tensor count kept), optionally with Adam state, and the layouts it is
// saved from and loaded into. One options struct, one builder, one set of CLI flags
// (tools/workload_flags.h).
#pragma once

#include <string>
#include <string_view>

#include "dcp/status.h"
#include "workload/layout_spec.h"
#include "workload/model.h"

namespace dcp::workload {

struct WorkloadOptions {
  std::string model = "qwen3-30b-a3b";  // MakeModel's names
  int layers = 2;
  double width_scale = 1.0;
  bool optimizer = false;   // add fp32 exp_avg and exp_avg_sq per parameter
  std::string save_layout;  // e.g. "tp2,dp2"; empty: the command's default
  std::string load_layout;  // empty: the command's default
};

struct Workload {
  ModelSpec model;
  LayoutSpec save_layout;
  LayoutSpec load_layout;
};

// The model and both layouts; an empty layout in `o` takes `default_save` / `default_load`
// (an empty `default_load`: the save layout). Errors name the bad option.
Result<Workload> MakeWorkload(const WorkloadOptions& o, std::string_view default_save,
                              std::string_view default_load = {});

}  // namespace dcp::workload
