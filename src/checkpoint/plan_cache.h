// Global plans of recent saves (SaveOptions::plan_cache), process-wide: a save whose ranks
// all find the plan of the same gathered local plans skips planning.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/save_plan.h"

namespace dcp::checkpoint {

// Global plans of recent saves, keyed by this rank's local plan hash. A hit is used only
// when every rank reports a cached plan for the same gathered hashes (`digest`).
struct CachedPlan {
  uint64_t digest;
  std::shared_ptr<const planner::GlobalSavePlan> plan;
  std::shared_ptr<const std::vector<std::string>> shared_values;  // SharedValueNames
};
class PlanCache {
 public:
  static constexpr size_t kCapacity = 16;
  std::optional<CachedPlan> Find(uint64_t local_hash) {
    std::lock_guard lock(mu_);
    auto it = map_.find(local_hash);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void Put(uint64_t local_hash, CachedPlan p) {
    std::lock_guard lock(mu_);
    if (!map_.count(local_hash)) {
      order_.push_back(local_hash);
      if (order_.size() > kCapacity) {
        map_.erase(order_.front());
        order_.pop_front();
      }
    }
    map_[local_hash] = std::move(p);
  }
  void Clear() {
    std::lock_guard lock(mu_);
    map_.clear();
    order_.clear();
  }

 private:
  std::mutex mu_;  // guards map_ and order_ (thread-rank tests share the process)
  std::unordered_map<uint64_t, CachedPlan> map_;
  std::list<uint64_t> order_;
};
// The process's cache; never destroyed: an async saver destroyed at exit may still be saving.
PlanCache& ProcessPlanCache();

}  // namespace dcp::checkpoint
