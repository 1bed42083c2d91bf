// Encode/Decode throughput of the global metadata at the scale of a large sharded model.
//
// Design budget (docs/format.md, docs/design.md): 1,000,000 chunks encode and decode in
// well under a second each, at under 100 bytes per chunk.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dcp/state_dict.h"
#include "metadata/codec.h"
#include "metadata/metadata.h"
#include "planner/load_plan.h"

namespace dcp::metadata {
namespace {

constexpr int kTensors = 10'000;
constexpr int kChunksPerTensor = 100;
constexpr int kFiles = 64;

// 10,000 2-D bf16 tensors, each row-sharded into 100 chunks that are spread over 64 data files
// (one per rank), with byte offsets that grow through each file as a real save lays them out.
Metadata MakeModelMetadata() {
  static constexpr int64_t kRowsPerChunk[] = {8, 16, 32, 64, 128};
  static constexpr int64_t kCols[] = {1024, 2048, 4096, 8192};
  static constexpr const char* kModules[] = {"mlp.down_proj",
                                             "mlp.gate_proj",
                                             "mlp.up_proj",
                                             "self_attn.k_proj",
                                             "self_attn.o_proj",
                                             "self_attn.q_proj",
                                             "self_attn.v_proj",
                                             "input_layernorm",
                                             "post_attention_layernorm",
                                             "embed"};
  Metadata md;
  md.save_id = 0x0123456789abcdefULL;
  md.world_size = kFiles;
  md.files.resize(kFiles);
  for (int f = 0; f < kFiles; ++f) {
    char name[64];
    std::snprintf(name, sizeof(name), "data-%016llx-r%05d.safetensors",
                  static_cast<unsigned long long>(md.save_id), f);
    md.files[f].name = name;
    md.files[f].size = 0;  // grows as chunks are placed
  }
  md.tensors.resize(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    TensorMeta& t = md.tensors[i];
    char fqn[96];
    std::snprintf(fqn, sizeof(fqn), "model.layers.%d.%s.weight", i / 10, kModules[i % 10]);
    t.fqn = fqn;
    t.dtype = DType::kBF16;
    const int64_t rows = kRowsPerChunk[i % 5];
    const int64_t cols = kCols[(i / 5) % 4];
    t.global_shape = Shape{rows * kChunksPerTensor, cols};
    t.chunks.resize(kChunksPerTensor);
    for (int j = 0; j < kChunksPerTensor; ++j) {
      StoredChunk& c = t.chunks[j];
      c.box = Box{Shape{rows * j, 0}, Shape{rows, cols}};
      c.file = static_cast<uint32_t>((i + j) % kFiles);
      c.byte_length = static_cast<uint64_t>(rows * cols) * 2;
      c.byte_offset = md.files[c.file].size;
      md.files[c.file].size += c.byte_length;
      c.xxh3 = (static_cast<uint64_t>(i) << 32 | j) * 0x9E3779B97F4A7C15ULL;
    }
  }
  std::sort(md.tensors.begin(), md.tensors.end(),
            [](const TensorMeta& a, const TensorMeta& b) { return a.fqn < b.fqn; });
  return md;
}

const Metadata& ModelMetadata() {
  static const Metadata md = MakeModelMetadata();
  return md;
}

void SetCounters(benchmark::State& state, size_t encoded_size) {
  const uint64_t chunks = ModelMetadata().TotalChunks();
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * chunks));
  state.counters["chunks"] = static_cast<double>(chunks);
  state.counters["bytes_per_chunk"] =
      static_cast<double>(encoded_size) / static_cast<double>(chunks);
}

void BM_Encode(benchmark::State& state) {
  const Metadata& md = ModelMetadata();
  size_t size = 0;
  for (auto _ : state) {
    std::string encoded = Encode(md);
    size = encoded.size();
    benchmark::DoNotOptimize(encoded.data());
  }
  SetCounters(state, size);
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

void BM_Decode(benchmark::State& state) {
  const std::string encoded = Encode(ModelMetadata());
  for (auto _ : state) {
    Result<Metadata> md = Decode(encoded);
    if (!md.ok()) {
      state.SkipWithError(md.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(md->tensors.data());
  }
  SetCounters(state, encoded.size());
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

// Load planning against the 1M stored chunks: one rank of a 64-rank job whose chunks are row
// slabs (FSDP-style resharding: each destination chunk meets ~2 of its tensor's 100 stored
// chunks) or column slabs (each meets all 100). PlanLoad intersects each destination chunk
// only with the stored chunks the index says are near (core/box_index.h).
StateDict DestinationFor(const Metadata& md, bool rows, int rank, int world) {
  // Planning never touches tensor memory; a dummy address satisfies "has memory".
  void* const kNotDereferenced = reinterpret_cast<void*>(uintptr_t{4096});
  StateDict sd;
  if (world == 0) {  // 64 row blocks of 4 per tensor, strided (a round-robin layout)
    for (const TensorMeta& t : md.tensors) {
      for (int k = 0; k < 64; ++k) {
        sd.add(t.fqn, TensorView(kNotDereferenced, t.dtype, Shape{4, t.global_shape[1]}),
               Chunk{t.global_shape, Shape{4 * (k * 256 + rank), 0}});
      }
    }
    return sd;
  }
  for (const TensorMeta& t : md.tensors) {
    const int d = rows ? 0 : 1;
    const int64_t n = t.global_shape[d], per = (n + world - 1) / world;
    Shape offsets = Shape::Zeros(2), lengths = t.global_shape;
    offsets[d] = std::min<int64_t>(per * rank, n);
    lengths[d] = std::min<int64_t>(per, n - offsets[d]);
    sd.add(t.fqn, TensorView(kNotDereferenced, t.dtype, lengths), Chunk{t.global_shape, offsets});
  }
  return sd;
}

// 64 tensors of 16,384 row-slab chunks each (FSDP over 16k ranks): 1M stored chunks in a few
// tensors, where testing every stored chunk per destination chunk is what costs.
const Metadata& WideMetadata() {
  static const Metadata md = [] {
    Metadata m;
    m.files = {{"data.safetensors", 0}};
    for (int i = 0; i < 64; ++i) {
      TensorMeta t;
      char fqn[64];
      std::snprintf(fqn, sizeof(fqn), "model.layers.%02d.weight", i);
      t.fqn = fqn;
      t.dtype = DType::kBF16;
      t.global_shape = Shape{16384 * 4, 2048};
      for (int j = 0; j < 16384; ++j) {
        StoredChunk c;
        c.box = Box{Shape{4 * j, 0}, Shape{4, 2048}};
        c.byte_length = 4 * 2048 * 2;
        c.byte_offset = m.files[0].size;
        m.files[0].size += c.byte_length;
        t.chunks.push_back(c);
      }
      m.tensors.push_back(std::move(t));
    }
    return m;
  }();
  return md;
}

void BM_PlanLoad(benchmark::State& state) {
  const Metadata& md = state.range(0) == 2 ? WideMetadata() : ModelMetadata();
  const StateDict sd =
      DestinationFor(md, state.range(0) != 1, 17, state.range(0) == 2 ? 0 : kFiles);
  uint64_t reads = 0;
  for (auto _ : state) {
    auto plan = planner::PlanLoad(sd, md, false, "bench");
    if (!plan.ok()) state.SkipWithError(plan.status().ToString().c_str());
    reads = plan.ok() ? plan->reads.size() : 0;
    benchmark::DoNotOptimize(reads);
  }
  state.counters["stored_chunks"] = static_cast<double>(md.TotalChunks());
  state.counters["read_items"] = static_cast<double>(reads);
  static const char* kLabels[] = {"100 chunks/tensor, row slabs (FSDP reshard)",
                                  "100 chunks/tensor, column slabs (TP reshard)",
                                  "16k chunks/tensor, 64 strided row blocks each"};
  state.SetLabel(kLabels[state.range(0)]);
}
BENCHMARK(BM_PlanLoad)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

}  // namespace
}  // namespace dcp::metadata

BENCHMARK_MAIN();
