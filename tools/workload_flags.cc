#include "tools/workload_flags.h"

namespace dcp::tools {

void AddWorkloadFlags(CLI::App* cmd, workload::WorkloadOptions* o, const std::string& save_help,
                      const std::string& load_help) {
  cmd->add_option("--model,--workload", o->model, "qwen3-30b-a3b, llama-dense or dense-500b")
      ->capture_default_str();
  cmd->add_option("--layers", o->layers, "transformer layers")->capture_default_str();
  cmd->add_option("--width-scale", o->width_scale, "shrink widths, keep the tensor count")
      ->capture_default_str();
  cmd->add_flag("--optimizer", o->optimizer, "add fp32 exp_avg and exp_avg_sq per parameter");
  cmd->add_option("--save-layout", o->save_layout, save_help);
  cmd->add_option("--load-layout", o->load_layout, load_help);
}

}  // namespace dcp::tools
