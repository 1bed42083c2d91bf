// Combining per-rank metadata (saves without collectives) into one global view.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/status.h"
#include "metadata/metadata.h"

namespace dcp::metadata {

// Files are concatenated; each tensor's chunks are the union over ranks (identical boxes
// written by several ranks are kept once, from the lowest rank). Fails when ranks disagree
// on a tensor's dtype or global shape, or when their world sizes differ (files from
// different saves), naming the ranks.
Result<Metadata> MergeRankMetadata(const std::vector<Metadata>& parts);

}  // namespace dcp::metadata
