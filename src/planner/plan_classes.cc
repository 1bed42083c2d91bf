#include "planner/plan_classes.h"

#include <xxhash.h>

#include <unordered_map>

namespace dcp::planner {

uint64_t PlanHash(std::string_view encoded_plan) {
  return XXH3_64bits(encoded_plan.data(), encoded_plan.size());
}

uint64_t DigestOfPlanHashes(std::span<const uint64_t> hash_of_rank) {
  return XXH3_64bits(hash_of_rank.data(), hash_of_rank.size_bytes());
}

PlanClasses GroupByPlanHash(std::span<const uint64_t> hash_of_rank) {
  PlanClasses out;
  out.class_of.resize(hash_of_rank.size());
  std::unordered_map<uint64_t, int> class_of_hash;
  // Ranks ascending: a class is numbered when its lowest rank is met, and its holders come
  // out sorted.
  for (size_t r = 0; r < hash_of_rank.size(); ++r) {
    auto [it, inserted] =
        class_of_hash.try_emplace(hash_of_rank[r], static_cast<int>(out.holders.size()));
    if (inserted) out.holders.emplace_back();
    out.holders[it->second].push_back(static_cast<int>(r));
    out.class_of[r] = it->second;
  }
  return out;
}

}  // namespace dcp::planner
