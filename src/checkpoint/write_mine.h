// What one rank of a save writes: its planned chunks and bytes entries, collected from its
// state dict in global plan order and written into its own files (against an incremental
// base: only the chunks the base does not hold).
#pragma once

#include <string>

#include "checkpoint/incremental.h"
#include "checkpoint/write_results.h"
#include "dcp/checkpoint.h"
#include "planner/save_plan.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// Writes this rank's items of `plan` to new files named by `save_id` (the tensor file over
// this rank's retired file in opts.recycle_dir when there is one); durable on return.
// With `base`, chunks it holds unchanged stay where they are and only the rest is written.
Status WriteMine(const StateDict& sd, const std::string& dir, const planner::GlobalSavePlan& plan,
                 int rank, uint64_t save_id, const SaveOptions& opts, storage::FileSystem& fs,
                 const BaseChunks* base, Written* out, SaveResult* result);

}  // namespace dcp::checkpoint
