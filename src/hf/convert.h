// Converting between HuggingFace safetensors checkpoints and dcp checkpoints, streaming:
// neither direction holds the whole model in memory.
//
// HF -> dcp: every source file is mapped read-only and its tensors are saved straight from
// the mapping (page cache, not process memory) by one dcp save; under several ranks each
// converts a byte-balanced share of the files, in one collective save.
// dcp -> HF: the output shards are planned from the metadata alone (greedy in fqn order, as
// transformers does); each is written tensor group by tensor group, every group filled by a
// dcp load into one bounded buffer, so memory stays near max(buffer, largest tensor). Under
// several ranks shard i is written by rank i % world; rank 0 writes the index last.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/checkpoint.h"
#include "dcp/comm.h"
#include "dcp/dtype.h"
#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::hf {

// "5GB", "500MB", "1.5GiB", "123": decimal units KB/MB/GB/TB (10^3...), binary KiB/MiB/GiB/TiB,
// case-insensitive, B optional. kInvalidArgument for anything else or 0.
Result<uint64_t> ParseByteSize(std::string_view text);

// ---- HF -> dcp

struct ToDcpOptions {
  std::shared_ptr<Comm> comm;  // null: a world of one
  // Called on every rank once the source is open, before the save: the tensor bytes of the
  // whole source and of this rank's share.
  std::function<void(uint64_t total_bytes, uint64_t my_bytes)> on_start;
};

struct ToDcpResult {
  uint64_t files = 0;        // source files converted by this rank
  uint64_t tensors = 0;      // by this rank
  uint64_t bytes = 0;        // tensor bytes, by this rank
  uint64_t total_bytes = 0;  // tensor bytes of the whole source
  SaveResult save;
  double seconds = 0;
};

// Which rank converts each file: largest first, each to the rank with the fewest bytes so
// far, ties to the lowest rank. Deterministic: every rank computes the same answer.
std::vector<int> AssignFiles(const std::vector<uint64_t>& file_bytes, int world);

Result<ToDcpResult> HfToDcp(const std::string& src, const std::string& dst,
                            const ToDcpOptions& opts, storage::FileSystem& fs);

// ---- dcp -> HF

struct OutTensor {
  std::string fqn;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;
};

struct OutShard {
  std::string file;             // "model.safetensors" or "model-00001-of-00003.safetensors"
  std::vector<size_t> tensors;  // indices into the tensor list, in file (data) order
  uint64_t bytes = 0;
};

// Greedy in the given (fqn) order: a tensor that would push the current shard past
// `max_shard_bytes` starts a new one, so a tensor larger than the cap sits alone. Within a
// shard tensors are ordered by element width, widest first (then fqn), so with the data
// starting 8-byte aligned every tensor is aligned to its element size.
std::vector<OutShard> PlanShards(const std::vector<OutTensor>& tensors, uint64_t max_shard_bytes);

struct ToHfOptions {
  std::shared_ptr<Comm> comm;  // null: a world of one
  uint64_t max_shard_bytes = 5'000'000'000;
  // Tensors are loaded in groups of at most this many bytes (a larger tensor alone).
  uint64_t buffer_bytes = uint64_t{256} << 20;
  // Called on this rank after each group written: tensor bytes and tensors done so far.
  std::function<void(uint64_t bytes, uint64_t tensors)> progress;
  // Called on every rank once the shards are planned: this rank's tensor bytes and tensors.
  std::function<void(uint64_t my_bytes, uint64_t my_tensors)> on_start;
};

struct ToHfResult {
  uint64_t shards_total = 0;
  uint64_t shards = 0;       // written by this rank
  uint64_t tensors = 0;      // by this rank
  uint64_t bytes = 0;        // tensor bytes, by this rank
  uint64_t total_bytes = 0;  // tensor bytes of the whole output (the index's total_size)
  uint64_t total_tensors = 0;
  std::vector<std::string> skipped_bytes_entries;  // safetensors cannot hold them
  double seconds = 0;
};

Result<ToHfResult> DcpToHf(const std::string& src, const std::string& dst, const ToHfOptions& opts,
                           storage::FileSystem& fs);

}  // namespace dcp::hf
