// The layout torch.distributed.checkpoint's HuggingFaceStorageWriter produces, so that files
// written here are the ones torch writes and reads: file names, the sharding metadata in each
// shard's header, the consolidated files' headers and the index.
//
// torch writes a rank's shard with the safetensors package (tensors ordered by dtype, widest
// first, then name; `__metadata__` holding the shard's offsets as Python-json text) and the
// consolidated files and index with Python's json module (", " and ": " separators, non-ASCII
// escaped, no padding): both spellings are reproduced byte for byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"
#include "dcp/status.h"
#include "hf/safetensors_header.h"

namespace dcp::hf {

inline constexpr std::string_view kShardingInfoKey = "DCP_SHARDING_INFO";
inline constexpr std::string_view kShardingVersionKey = "DCP_VERSION";
inline constexpr std::string_view kShardingVersion = "1.0";
inline constexpr std::string_view kShardedDirName = "sharded";

// "model-00002-of-00005.safetensors"; with a shard (a writer's 1-based number),
// "shard-00001-model-00002-of-00005.safetensors".
std::string TorchHfFileName(int index, int max_index, int shard = 0);

// Whether `name` is one of the names above (either kind).
bool IsTorchHfFileName(std::string_view name);

// `s` as Python's json.dumps writes a str: quoted, non-ASCII as \uXXXX (surrogate pairs past
// U+FFFF), control characters and DEL escaped. Invalid UTF-8 bytes become U+FFFD.
std::string PyJsonString(std::string_view s);

// The order safetensors serializes tensors in: by dtype, widest first (its enum order,
// reversed), then by name.
bool SafetensorsOrderLess(DType a_dtype, std::string_view a_name, DType b_dtype,
                          std::string_view b_name);

// The iteration order of a Python set of small non-negative ints added in the given order
// (CPython's table: hash(i) == i, linear probes, growth past 3/5 full): torch's
// dedup_save_plans gives a replicated chunk to the first holder of least size in that order.
std::vector<int> PythonSetOrder(const std::vector<int>& added);

struct ShardedTensor {
  std::string name;
  Shape offsets;  // where this chunk sits in the whole tensor
};

// The value of `DCP_SHARDING_INFO`: json.dumps({name: {"saved_offsets": [...]}, ...}) in the
// given order.
std::string ShardingInfoJson(const std::vector<ShardedTensor>& tensors);

// The offsets `DCP_SHARDING_INFO` (`json`, from the header of `file`) gives each of `tensors`,
// checked: a JSON object with one {"saved_offsets": [...]} per tensor, as many offsets as
// dimensions, each chunk's end within 2^62. kDataLoss naming the file and the tensor.
Result<std::vector<Shape>> ParseShardingInfo(std::string_view json,
                                             const std::vector<HeaderTensor>& tensors,
                                             std::string_view file);

struct WholeTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;
};

// A consolidated file's header as torch writes it: the 8-byte length, then
// json.dumps({name: {"shape": [...], "dtype": "F32", "data_offsets": [b, e]}, ...}) with the
// tensors' data one after another in the given order.
std::string TorchConsolidatedHeader(const std::vector<WholeTensor>& tensors);

// model.safetensors.index.json as torch writes it (json.dump(..., indent=2), no final newline):
// {"metadata": {"total_size": N}, "weight_map": {name: file, ...}} in the given order.
std::string TorchIndexJson(uint64_t total_size,
                           const std::vector<std::pair<std::string, std::string>>& weight_map);

}  // namespace dcp::hf
