// Byte-balanced choice among holders, at the cost of distinct plans rather than ranks.
//
// Ranks with identical plans form a class and are interchangeable, so one min-heap of
// (bytes assigned, rank) per class finds the least-loaded holder of an item held by a set
// of classes in O(classes x log ranks). Ties go to the lowest rank. Used by the save
// planner (who writes a replicated chunk) and the load planner (who reads a shared shard).
#pragma once

#include <cstdint>
#include <queue>
#include <utility>
#include <vector>

namespace dcp::planner {

class ClassBalancer {
 public:
  // `holders[c]`: the ranks of class c (each rank in exactly one class);
  // `loads[r]`: what rank r carries already.
  ClassBalancer(const std::vector<std::vector<int>>& holders, const std::vector<uint64_t>& loads)
      : heaps_(holders.size()) {
    for (size_t c = 0; c < holders.size(); ++c) {
      for (int r : holders[c]) heaps_[c].push({loads[r], r});
    }
  }

  // The least-loaded rank among `classes` (ties: lowest rank) and its load.
  std::pair<uint64_t, int> Least(const std::vector<int>& classes) const {
    return heaps_[LeastClass(classes)].top();
  }

  // The least-loaded rank among `classes` (ties: lowest rank), now carrying `weight` more.
  int Assign(const std::vector<int>& classes, uint64_t weight) {
    const int best = LeastClass(classes);
    auto [load, rank] = heaps_[best].top();
    heaps_[best].pop();
    heaps_[best].push({load + weight, rank});
    return rank;
  }

 private:
  int LeastClass(const std::vector<int>& classes) const {
    int best = -1;
    for (int c : classes) {
      if (heaps_[c].empty()) continue;
      if (best < 0 || heaps_[c].top() < heaps_[best].top()) best = c;
    }
    return best;
  }

  using Slot = std::pair<uint64_t, int>;
  std::vector<std::priority_queue<Slot, std::vector<Slot>, std::greater<>>> heaps_;
};

}  // namespace dcp::planner
