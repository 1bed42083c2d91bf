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

// The same, for rank files that carry their save's identity (`steps[r]` for `parts[r]`,
// from the file names): refuses, naming two ranks and their steps, unless every step is
// the same, so that files of two different saves are never mixed.
Result<Metadata> MergeRankMetadata(const std::vector<Metadata>& parts,
                                   const std::vector<uint64_t>& steps);

}  // namespace dcp::metadata
