// The shared phase of a load: shared data read once and sent to every rank that needs it
// (docs/design.md).
//
// First the shared stored chunks (a reshard's, a memory tier restore's): each read whole by one
// rank into a staging buffer and broadcast (small ones together per (group, reader)); every
// consumer copies its regions out (a lone chunk a destination holds as one run goes straight
// into it). Chunks whose members each need a part of them (SharedChunk::parts) go as those
// parts instead, where the backend sends each member only its own (Comm::IScatterV), straight
// into its destination where its regions tile its part. Then the
// shared shards and slabs: each group exchanges them in a few rounds of one all-gather
// (planner::ScheduleGathers, issued in one global order of (round, group)); in each, every member
// first reads its slabs of the round whole (all their read items, possibly from several files) into
// its destination, then sends them to all members straight from and into destination memory, and
// goes on reading the next round. At most `max_broadcasts_in_flight` collectives are outstanding.
#pragma once

#include <memory>
#include <vector>

#include "checkpoint/chunk_reads.h"
#include "core/copy_runs.h"
#include "dcp/comm.h"
#include "planner/broadcast_plan.h"
#include "storage/chunk_reader.h"

namespace dcp::checkpoint {

// The communicator of every group this rank belongs to (null for the others), created
// collectively where any member lacks it and cached across loads on the same `world`; a
// group equal to the world is `world` itself. Adds the number created to stats.
Result<std::vector<std::shared_ptr<Comm>>> ResolveGroups(const std::shared_ptr<Comm>& world,
                                                         const planner::BroadcastPlan& plan,
                                                         uint64_t* created);

// How the shared phase cuts shared shards into all-gathers (dcp simulate counts with the
// same): unless the backend's all-gathers are in place (Comm::gathers_in_place), the small
// slabs a round packs stay within a quarter of `smallest_budget`, the smallest
// LoadOptions::max_broadcast_buffer_bytes among the ranks (every rank must cut alike).
planner::GatherLimits GatherLimitsFor(uint64_t smallest_budget, bool in_place);

// This rank's part in a shared stored chunk: where its regions go once it has arrived.
struct MyChunk {
  bool member = false;
  std::vector<storage::ChunkTarget> targets;  // runs point into `runs`
  std::vector<CopyRuns> runs;
};

// This rank's part in a shared shard or slab.
struct MyShard {
  std::byte* dst = nullptr;          // this rank's memory for it (the slab); null: not a member
  std::vector<uint32_t> read_items;  // indices into the shared-phase reads (reader only)
};

// Runs the shared phase: shared stored chunks first (each read whole by one rank and
// broadcast, or sent as parts where the plan and the backend allow (SharedChunk::parts), every
// consumer scattering its regions), then shared destination shards and
// slabs by rounds of all-gathers, each slab filled by its reader from `shared_reads` (read items
// cut to the slab). A read failure on this rank does not stop the protocol (peers wait on its
// collectives): it is returned in *read_failure after every collective was posted and
// completed; the return value is a communication failure, which ends the load at once.
Status RunSharedPhase(Comm& world, const metadata::Metadata& md, const planner::BroadcastPlan& plan,
                      const std::vector<std::shared_ptr<Comm>>& groups,
                      const std::vector<MyChunk>& my_chunks, const std::vector<MyShard>& mine,
                      const planner::LocalLoadPlan& shared_reads, ChunkReads& reads,
                      const LoadOptions& opts, uint64_t smallest_budget, LoadResult* stats,
                      Status* read_failure);

}  // namespace dcp::checkpoint
