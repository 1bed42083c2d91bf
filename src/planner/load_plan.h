// Load planning: intersect the chunks a rank wants with the stored chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/state_dict.h"
#include "dcp/status.h"
#include "metadata/metadata.h"

namespace dcp::planner {

// Copy `region` of stored chunk (tensor, chunk) of the metadata into destination chunk
// (entry, dst_chunk) of the state dict.
struct ReadItem {
  uint32_t entry = 0;      // state dict entry index
  uint32_t dst_chunk = 0;  // chunk index within that entry
  uint32_t tensor = 0;     // metadata tensor index
  uint32_t stored = 0;     // stored chunk index within that tensor
  Box region;
};

struct BytesRead {
  uint32_t entry = 0;  // state dict entry index
  uint32_t bytes = 0;  // metadata bytes entry index
};

struct LocalLoadPlan {
  std::vector<ReadItem> reads;  // sorted by (file, byte offset, tensor, stored chunk)
  std::vector<BytesRead> bytes;
  std::vector<uint32_t> skipped;  // entries absent from the checkpoint (partial load)
};

// Fails with one clear error naming the checkpoint `ckpt` and the fqn: missing key (unless
// allow_partial), tensor/bytes kind mismatch, dtype or global shape mismatch, a destination
// chunk outside the global shape or not matching its view, or not covered by stored chunks.
Result<LocalLoadPlan> PlanLoad(const StateDict& sd, const metadata::Metadata& md,
                               bool allow_partial, const std::string& ckpt);

}  // namespace dcp::planner
