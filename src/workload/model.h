// Synthetic model shapes for the demo, the benchmarks and the tests.
//
// A ModelSpec lists every tensor of a real architecture (names, shapes, which dimension
// tensor parallelism shards, which expert a tensor belongs to). It holds no data; see
// populate.h for state dicts filled with a verifiable pattern.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"
#include "dcp/status.h"

namespace dcp::workload {

struct TensorSpec {
  std::string fqn;
  DType dtype = DType::kBF16;
  Shape shape;
  int tp_dim = -1;  // dimension sharded by tensor parallelism; -1 = replicated
  int expert = -1;  // expert index for MoE expert weights; -1 otherwise

  uint64_t NumBytes() const;
};

struct ModelSpec {
  std::string name;
  int num_layers = 0;
  int num_experts = 0;  // 0 for dense models; expert indices are in [0, num_experts)
  std::vector<TensorSpec> tensors;

  uint64_t TotalBytes() const;
};

// Known model names: "qwen3-30b-a3b" (MoE), "llama-dense" (Llama-3-8B-like) and
// "dense-500b" (a Llama-3-405B-like shape widened to ~499B parameters at 126 layers: hidden
// 16384, 128 heads, 16 kv heads, head dim 128, MLP width 67584, vocab 128256), the dense
// shape `dcp simulate` plans at scale.
const std::vector<std::string_view>& ModelNames();

// Bounds on synthetic models: far above any real architecture (dense-500b has 126 layers), low
// enough that a typo cannot make the builder itself exhaust memory.
inline constexpr int kMaxLayers = 4096;

// The tensors of `name` with `layers` decoder layers. `width_scale` in (0, 1] shrinks the
// hidden size, head dim, MLP/expert width and vocab (each rounded to a multiple of 8, at
// least 8) while keeping the tensor count, so a big model's shape fits a small machine.
// InvalidArgument for an unknown name, layers outside [1, kMaxLayers], a scale outside (0, 1]
// or below 1e-6, or a sub-byte
// dtype (the verification pattern is defined per byte of an element).
Result<ModelSpec> MakeModel(std::string_view name, int layers, double width_scale = 1.0,
                            DType dtype = DType::kBF16);

// Adds Adam-style optimizer state: for every tensor of `model` (as it stands), two F32
// moment tensors `<fqn>.exp_avg` and `<fqn>.exp_avg_sq` with the same shape, tensor-parallel
// dimension and expert, so every layout shards them like their parameter. Appended after
// the parameters.
void AddOptimizerState(ModelSpec* model);

}  // namespace dcp::workload
