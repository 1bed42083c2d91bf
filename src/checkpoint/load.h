// Load, through the metadata -> planner -> storage layers, on any Comm.
#pragma once

#include <string>

#include "dcp/checkpoint.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

Result<LoadResult> Load(StateDict& sd, const std::string& dir, const LoadOptions& opts,
                        storage::FileSystem& fs);

}  // namespace dcp::checkpoint
