#include "workload/workload.h"

namespace dcp::workload {

Result<Workload> MakeWorkload(const WorkloadOptions& o, std::string_view default_save,
                              std::string_view default_load) {
  Workload w;
  DCP_ASSIGN_OR_RETURN(w.model, MakeModel(o.model, o.layers, o.width_scale));
  if (o.optimizer) AddOptimizerState(&w.model);
  auto save = ParseLayout(o.save_layout.empty() ? default_save : o.save_layout);
  if (!save.ok()) return save.status().Annotate("--save-layout: ");
  w.save_layout = std::move(save).value();
  const std::string load_text = !o.load_layout.empty()  ? o.load_layout
                                : !default_load.empty() ? std::string(default_load)
                                                        : w.save_layout.ToString();
  auto load = ParseLayout(load_text);
  if (!load.ok()) return load.status().Annotate("--load-layout: ");
  w.load_layout = std::move(load).value();
  return w;
}

}  // namespace dcp::workload
