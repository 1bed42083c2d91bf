// Save, through the planner -> storage -> metadata layers, on any Comm.
#pragma once

#include <string>

#include "dcp/checkpoint.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

Result<SaveResult> Save(const StateDict& sd, const std::string& dir, const SaveOptions& opts,
                        storage::FileSystem& fs);

// Forgets every cached global plan (tests).
void ClearSavePlanCache();

}  // namespace dcp::checkpoint
