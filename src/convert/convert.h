// The conversions behind dcp/convert.h, on a given file system, and their pure planning
// steps (tested alone).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/convert.h"
#include "dcp/dtype.h"
#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::convert {

// ---- HF -> dcp

// Which rank converts each file: largest first, each to the rank with the fewest bytes so
// far, ties to the lowest rank. Deterministic: every rank computes the same answer.
std::vector<int> AssignFiles(const std::vector<uint64_t>& file_bytes, int world);

// `fs` holds the source (mapped: a local file system); the checkpoint is saved into `dst_fs`
// when given (an object store), else into `fs`.
Result<HfToDcpResult> HfToDcp(const std::string& src, const std::string& dst,
                              const HfToDcpOptions& opts, storage::FileSystem& fs,
                              storage::FileSystem* dst_fs = nullptr);

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

// Writes `path` (as `path`.tmp, renamed into place once durable): `header`, then the tensors
// `order` (indices into `tensors`) one after another, loaded from checkpoint `src` (read from
// `src_fs`) group by group into `buffer`: consecutive tensors up to `buffer_bytes`, a larger one
// alone. `progress` (optional): bytes and tensors written so far.
Status WriteLoadedTensors(const std::string& src, const std::string& path,
                          const std::string& header, const std::vector<OutTensor>& tensors,
                          const std::vector<size_t>& order, uint64_t buffer_bytes,
                          const std::function<void(uint64_t bytes, uint64_t tensors)>& progress,
                          storage::FileSystem& src_fs, storage::FileSystem& fs,
                          std::vector<std::byte>& buffer);

// `fs` holds the export (written into a staging directory renamed into place: a local file
// system); the checkpoint is read from `src_fs` when given (an object store), else from `fs`.
// `after_shard` (tests): called on this rank after shard `index` is written and the source
// checked.
Result<DcpToHfResult> DcpToHf(const std::string& src, const std::string& dst,
                              const DcpToHfOptions& opts, storage::FileSystem& fs,
                              const std::function<void(size_t index)>& after_shard = {},
                              storage::FileSystem* src_fs = nullptr);

// save_torch_hf (dcp/convert.h) on a given file system.
Result<TorchHfSaveResult> SaveTorchHf(const StateDict& sd, const std::string& dir,
                                      const TorchHfSaveOptions& opts, storage::FileSystem& fs);

}  // namespace dcp::convert
