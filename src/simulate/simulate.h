// `dcp simulate`: plan the save and load of a whole job of N ranks in one process, with no
// tensor data, through the very planner code real runs use (docs/design.md).
//
// Ranks whose local plans are identical form one plan class (data-parallel replicas). The
// simulator builds one local plan per class, groups ranks by plan hash exactly as Save does,
// runs planner::PlanSave over the distinct plans, builds the metadata that plan implies
// (fake file offsets and checksums) and times its encoding, and runs planner::PlanLoad for
// one representative rank per distinct load plan. Costs therefore follow distinct plans,
// and the report says so next to the bytes each rank would exchange.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/status.h"
#include "workload/workload.h"

namespace dcp::simulate {

struct SimulateOptions {
  // Save layout default "dp<ranks>"; load layout default: the save layout.
  workload::WorkloadOptions workload{.layers = 48};
  int ranks = 0;  // the load layout's world size (the save layout may have another)
  // Ranks r and r' share a host (and its page cache) when r / ranks_per_host equals
  // r' / ranks_per_host; replicas within a host are not broadcast, as in Load.
  int ranks_per_host = 8;
  // Also build and hash every rank's local plan, and check that the plan classes found by
  // hash are exactly those the layout implies (O(ranks x items): small jobs and tests).
  bool check_classes = false;
};

struct Distribution {
  uint64_t min = 0, max = 0, sum = 0;
  double mean = 0;
};

struct SimulateReport {
  SimulateOptions options;
  std::string save_layout, load_layout;
  uint64_t tensors = 0, bytes_entries = 0, chunks = 0;  // stored, in the metadata
  uint64_t unique_bytes = 0;                            // tensor chunks + bytes entries
  uint64_t model_bytes = 0;                             // the model's tensors, as a check

  // Save planning.
  int save_plan_classes = 0;
  uint64_t save_plan_items = 0;       // over the distinct plans
  double local_plan_seconds = 0;      // one rank: its items, encoded and hashed
  double classes_seconds = 0;         // simulator only: finding the classes
  double plan_seconds = 0;            // planner::PlanSave over the distinct plans
  double cache_hit_plan_seconds = 0;  // digest of the gathered hashes, as on a cache hit
  bool classes_checked = false;       // every rank's plan hashed and matched
  Distribution bytes_written;         // per rank (ranks writing nothing count as 0)
  uint64_t writers = 0;               // ranks writing at least one item
  // Bytes each rank receives for the plan exchange (all-gathers).
  uint64_t hello_bytes_per_rank = 0;     // Save's hello (checkpoint::kSaveHelloBytes) x ranks
  uint64_t plans_bytes_per_rank = 0;     // the distinct plans, each sent once
  uint64_t exchange_bytes_per_rank = 0;  // miss: hello + plans; a hit: the hello only
  uint64_t max_encoded_plan_bytes = 0;
  uint64_t commit_gather_bytes = 0;  // write results gathered at rank 0

  // Metadata.
  uint64_t metadata_bytes = 0;
  uint64_t metadata_files = 0;
  double metadata_build_seconds = 0;
  double metadata_encode_seconds = 0;
  double metadata_decode_seconds = 0;

  // Load planning (one representative rank per distinct load plan).
  int load_plan_classes = 0;
  double load_plan_seconds = 0;          // PlanLoad, summed over the representatives
  double load_plan_max_seconds = 0;      // the slowest representative: a rank's cost
  uint64_t load_read_items = 0;          // over the representatives
  Distribution read_bytes_no_broadcast;  // per rank: whole stored chunks it reads itself
  Distribution files_opened_no_broadcast;
  uint64_t read_bytes_once = 0;  // every stored chunk some rank needs, read once: the floor
  // With read-once broadcast (planner::PlanBroadcast over the distinct load identities).
  bool broadcast_planned = false;
  double broadcast_plan_seconds = 0;
  uint64_t identity_exchange_bytes_per_rank = 0;  // 8 B hash x ranks + distinct identities
  uint64_t broadcast_groups = 0;
  uint64_t shared_shards = 0;          // broadcast units: whole shared shards and slabs of cut ones
  uint64_t shared_chunks = 0;          // stored chunks read once, whole, and broadcast
  uint64_t broadcast_ops = 0;          // job-wide: broadcasts of shared stored chunks
  uint64_t broadcast_batches = 0;      // job-wide: of those, of several chunks
  uint64_t broadcast_batch_bytes = 0;  // the LoadOptions default used for batching
  uint64_t gather_ops = 0;             // job-wide: all-gathers of shared shards
  Distribution collectives_per_rank;   // broadcasts and all-gathers each rank takes part in
  Distribution groups_per_rank;        // broadcast groups each rank belongs to
  double max_collectives_per_group = 0;  // max over ranks of collectives / groups
  // Storage bytes each rank reads (PlanBroadcast's read_bytes, stored-chunk sharing on).
  Distribution read_bytes_broadcast;
};

Result<SimulateReport> Simulate(const SimulateOptions& opts);

std::string FormatReport(const SimulateReport& r);
std::string ReportJson(const SimulateReport& r);  // the schema in docs/benchmarks.md

}  // namespace dcp::simulate
