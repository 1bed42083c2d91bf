// Save planning: what each rank holds (local plan) and who writes what (global plan).
//
// The global plan is a pure function of the distinct local plans and the ranks holding
// each, so every rank (or a simulator) computes the identical result. Ranks with identical
// local plans (data-parallel replicas) are one "plan class": the cost follows distinct
// plans, not ranks x items.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"
#include "dcp/state_dict.h"
#include "dcp/status.h"

namespace dcp::planner {

struct SaveItem {
  std::string fqn;
  bool is_bytes = false;
  DType dtype = DType::kU8;  // tensors only
  Shape global_shape;        // tensors only
  Box box;                   // tensors only
  uint64_t nbytes = 0;
  std::string path;  // StateEntry::path, on an entry's first item only

  friend bool operator==(const SaveItem&, const SaveItem&) = default;
};

struct LocalSavePlan {
  std::vector<SaveItem> items;  // state dict order
};

// Validates the state dict (views match boxes, chunks inside the global shape, one dtype
// per fqn, whole bytes for sub-byte dtypes, host memory) and lists its items.
Result<LocalSavePlan> BuildLocalSavePlan(const StateDict& sd);

std::string EncodeLocalPlan(const LocalSavePlan& plan);
Result<LocalSavePlan> DecodeLocalPlan(std::string_view data);

struct GlobalSavePlan {
  struct Chunk {
    Box box;
    uint64_t nbytes = 0;
    int writer = -1;
  };
  struct Tensor {
    std::string fqn;
    DType dtype = DType::kU8;
    Shape global_shape;
    // Sorted by box. A replicated chunk may appear as several pieces (split_replicas): each
    // writer writes a dimension-0 slice of the chunk it holds.
    std::vector<Chunk> chunks;
    std::string path;  // StateEntry::path of the first plan class naming one
  };
  struct Bytes {
    std::string fqn;
    uint64_t nbytes = 0;
    int writer = -1;
    std::string path;
  };
  std::vector<Tensor> tensors;           // sorted by fqn
  std::vector<Bytes> bytes;              // sorted by fqn
  std::vector<uint64_t> bytes_per_rank;  // bytes entries weigh 1
  uint64_t unique_bytes = 0;
};

struct SavePlanOptions {
  // true: each replicated chunk goes to the holder with the fewest bytes so far (largest
  // chunks first); false: to its lowest-ranked holder.
  bool balance = true;
  // Require the chunks of every tensor to cover it (off when each rank plans alone).
  bool require_coverage = true;
  // With balance: split a replicated chunk larger than an eighth of a rank's fair share of
  // the checkpoint (and 256 KiB) along dimension 0 into pieces of about that size, which its
  // holders write, so writers end near the mean and loads get units small enough to balance.
  bool split_replicas = true;
};

// `holders[i]` are the ranks whose local plan equals `plans[i]` (sorted, disjoint, covering
// 0..world_size-1). Fails (kInvalidArgument) when ranks disagree on an fqn's dtype, global
// shape or kind, or when a tensor's chunks overlap without being identical or do not
// cover it; the message names the fqn and ranks.
Result<GlobalSavePlan> PlanSave(const std::vector<LocalSavePlan>& plans,
                                const std::vector<std::vector<int>>& holders, int world_size,
                                const SavePlanOptions& opts = {});

}  // namespace dcp::planner
