// Ranks grouped by identical local plans: data-parallel replicas hold
// identical chunk lists, so a job of thousands of ranks has a handful of distinct plans. Each
// rank sends a hash of its encoded plan; each distinct plan is then exchanged once (by the
// lowest rank holding it) and planned over once. Save, load and the simulator all group here.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace dcp::planner {

// The hash that identifies an encoded local plan (XXH3-64).
uint64_t PlanHash(std::string_view encoded_plan);

// One hash over every rank's plan hash, in rank order: the identity of a whole job's plans
// (the plan cache's key).
uint64_t DigestOfPlanHashes(std::span<const uint64_t> hash_of_rank);

struct PlanClasses {
  // Per class, its ranks ascending; classes ordered by their lowest rank, so every rank
  // numbers them alike.
  std::vector<std::vector<int>> holders;
  std::vector<int> class_of;  // per rank

  // Whether `rank` is the one that sends its class's plan (its lowest rank).
  bool IsSender(int rank) const { return holders[class_of[rank]].front() == rank; }
};

// Ranks with equal hashes form one class. Pure and deterministic.
PlanClasses GroupByPlanHash(std::span<const uint64_t> hash_of_rank);

}  // namespace dcp::planner
