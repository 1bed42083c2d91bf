// Save, through the planner -> storage -> metadata layers, on any Comm.
#pragma once

#include <string>

#include "dcp/checkpoint.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// What each rank contributes to a save's first exchange: its plan hash, the digest of its
// cached plan (0: none) and a candidate save id. dcp simulate counts exchange bytes with it.
inline constexpr uint64_t kSaveHelloBytes = 3 * 8;

Result<SaveResult> Save(const StateDict& sd, const std::string& dir, const SaveOptions& opts,
                        storage::FileSystem& fs);

// Forgets every cached global plan (tests).
void ClearSavePlanCache();

}  // namespace dcp::checkpoint
