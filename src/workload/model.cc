#include "workload/model.h"

#include <algorithm>
#include <cmath>

namespace dcp::workload {
namespace {

// Tensor-parallel split of a Linear weight [out, in]: column-parallel layers shard the
// output dim, row-parallel layers (whose input is already sharded) shard the input dim.
constexpr int kColumnParallel = 0;
constexpr int kRowParallel = 1;
constexpr int kReplicated = -1;

struct Dims {
  int64_t hidden;
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t mlp_width;  // dense intermediate size, or the per-expert (moe) intermediate size
  int64_t vocab;
  int experts;  // 0 = dense
  bool qk_norm;
};

// Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B).
constexpr Dims kQwen3MoE = {2048, 32, 4, 128, 768, 151936, 128, true};
// Llama-3-8B-like dense model.
constexpr Dims kLlamaDense = {4096, 32, 8, 128, 14336, 128256, 0, false};
// ~500B dense: Llama-3-405B's attention (16 kv heads instead of 8) with a wider MLP. Per
// layer 0.604e9 (attention) + 3.322e9 (MLP) parameters; at 126 layers with embeddings and
// lm_head 4.2e9: 498.9e9 parameters, 929 GiB bf16.
constexpr Dims kDense500B = {16384, 128, 16, 128, 67584, 128256, 0, false};

int64_t Scale(int64_t n, double s) {
  return std::max<int64_t>(8, std::llround(static_cast<double>(n) * s / 8.0) * 8);
}

class Builder {
 public:
  Builder(ModelSpec* spec, DType dtype) : spec_(spec), dtype_(dtype) {}

  void Add(std::string fqn, Shape shape, int tp_dim, int expert = -1) {
    spec_->tensors.push_back(TensorSpec{std::move(fqn), dtype_, shape, tp_dim, expert});
  }

 private:
  ModelSpec* spec_;
  DType dtype_;
};

void BuildDecoder(const Dims& d, int layers, Builder& b) {
  const int64_t h = d.hidden;
  const int64_t q = d.heads * d.head_dim;
  const int64_t kv = d.kv_heads * d.head_dim;
  b.Add("model.embed_tokens.weight", {d.vocab, h}, kColumnParallel);
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    b.Add(p + "input_layernorm.weight", {h}, kReplicated);
    b.Add(p + "self_attn.q_proj.weight", {q, h}, kColumnParallel);
    b.Add(p + "self_attn.k_proj.weight", {kv, h}, kColumnParallel);
    b.Add(p + "self_attn.v_proj.weight", {kv, h}, kColumnParallel);
    b.Add(p + "self_attn.o_proj.weight", {h, q}, kRowParallel);
    if (d.qk_norm) {
      b.Add(p + "self_attn.q_norm.weight", {d.head_dim}, kReplicated);
      b.Add(p + "self_attn.k_norm.weight", {d.head_dim}, kReplicated);
    }
    b.Add(p + "post_attention_layernorm.weight", {h}, kReplicated);
    if (d.experts == 0) {
      b.Add(p + "mlp.gate_proj.weight", {d.mlp_width, h}, kColumnParallel);
      b.Add(p + "mlp.up_proj.weight", {d.mlp_width, h}, kColumnParallel);
      b.Add(p + "mlp.down_proj.weight", {h, d.mlp_width}, kRowParallel);
      continue;
    }
    b.Add(p + "mlp.gate.weight", {d.experts, h}, kReplicated);  // router
    for (int e = 0; e < d.experts; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      b.Add(ep + "gate_proj.weight", {d.mlp_width, h}, kColumnParallel, e);
      b.Add(ep + "up_proj.weight", {d.mlp_width, h}, kColumnParallel, e);
      b.Add(ep + "down_proj.weight", {h, d.mlp_width}, kRowParallel, e);
    }
  }
  b.Add("model.norm.weight", {h}, kReplicated);
  b.Add("lm_head.weight", {d.vocab, h}, kColumnParallel);
}

}  // namespace

uint64_t TensorSpec::NumBytes() const {
  return DTypeBytes(dtype, shape.NumElements().value_or(0)).value_or(0);
}

uint64_t ModelSpec::TotalBytes() const {
  uint64_t n = 0;
  for (const TensorSpec& t : tensors) n += t.NumBytes();
  return n;
}

const std::vector<std::string_view>& ModelNames() {
  static const std::vector<std::string_view> kNames = {"qwen3-30b-a3b", "llama-dense",
                                                       "dense-500b"};
  return kNames;
}

Result<ModelSpec> MakeModel(std::string_view name, int layers, double width_scale, DType dtype) {
  Dims d;
  if (name == "qwen3-30b-a3b") {
    d = kQwen3MoE;
  } else if (name == "llama-dense") {
    d = kLlamaDense;
  } else if (name == "dense-500b") {
    d = kDense500B;
  } else {
    std::string known;
    for (std::string_view n : ModelNames()) known += (known.empty() ? "" : ", ") + std::string(n);
    return InvalidArgument("unknown model '" + std::string(name) + "' (known: " + known + ")");
  }
  if (layers < 1 || layers > kMaxLayers) {
    return InvalidArgument("model '" + std::string(name) + "' needs 1 to " +
                           std::to_string(kMaxLayers) + " layers, got " + std::to_string(layers));
  }
  if (!(width_scale > 0.0 && width_scale <= 1.0)) {  // also rejects NaN
    return InvalidArgument("width scale must be in (0, 1], got " + std::to_string(width_scale));
  }
  if (width_scale < 1e-6) {  // every width is at least 8 already; smaller scales are typos
    return InvalidArgument("width scale must be at least 1e-6, got " + std::to_string(width_scale));
  }
  if (DTypeBits(dtype) % 8 != 0) {
    return InvalidArgument("synthetic models need a whole-byte dtype, got " +
                           std::string(DTypeName(dtype)));
  }
  // Head counts and expert count stay: they fix the tensor count and the TP/EP structure.
  d.hidden = Scale(d.hidden, width_scale);
  d.head_dim = Scale(d.head_dim, width_scale);
  d.mlp_width = Scale(d.mlp_width, width_scale);
  d.vocab = Scale(d.vocab, width_scale);

  ModelSpec spec;
  spec.name = std::string(name);
  spec.num_layers = layers;
  spec.num_experts = d.experts;
  Builder b(&spec, dtype);
  BuildDecoder(d, layers, b);
  return spec;
}

void AddOptimizerState(ModelSpec* model) {
  const size_t n = model->tensors.size();
  model->tensors.reserve(3 * n);
  for (size_t i = 0; i < n; ++i) {
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      TensorSpec m = model->tensors[i];
      m.fqn += suffix;
      m.dtype = DType::kF32;
      model->tensors.push_back(std::move(m));
    }
  }
}

}  // namespace dcp::workload
