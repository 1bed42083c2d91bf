// Where a shared shard may be cut into slabs that different members read (broadcast_plan.cc):
// with verified reads, only where the readers on either side fetch disjoint stored bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/box.h"
#include "metadata/metadata.h"
#include "planner/stored_chunk_finder.h"

namespace dcp::planner {

// `box` cut along dimension 0 into about nbytes / slab_bytes slabs of similar size: at even
// rows, or with whole-chunk reads at the allowed rows nearest to them (CutRows); {box} when it
// is small or cannot be cut.
std::vector<Box> CutIntoSlabs(uint32_t tensor, const Box& box, uint64_t nbytes, uint64_t slab_bytes,
                              StoredChunkFinder* finder, const metadata::Metadata* md,
                              bool whole_chunk_reads);

}  // namespace dcp::planner
