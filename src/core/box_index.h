// The boxes of a fixed set that intersect a query box, without testing every one.
//
// Boxes are sorted along the dimension whose offsets vary most (the split dimension of slab
// layouts); a query looks only at boxes whose start along it lies in
// (query start - longest extent, query end), found by binary search. For slab and grid
// layouts that is O(log n + hits) instead of O(n): load planning at 1M stored chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dcp/box.h"

namespace dcp {

class BoxIndex {
 public:
  // `boxes` must outlive the index; all of one rank (a tensor's stored chunks).
  explicit BoxIndex(const std::vector<Box>& boxes);
  template <typename GetBox>
  BoxIndex(size_t n, GetBox box_at);

  // Indices (ascending) of the boxes that intersect `query` in a non-empty region.
  std::vector<size_t> Intersecting(const Box& query) const;

 private:
  void Build(size_t n);

  std::vector<Box> boxes_;
  int dim_ = -1;                // sweep dimension; -1: rank 0 boxes, every box is a candidate
  std::vector<size_t> order_;   // box indices by start along dim_
  std::vector<int64_t> start_;  // start along dim_, in order_
  int64_t longest_ = 0;         // largest extent along dim_
};

template <typename GetBox>
BoxIndex::BoxIndex(size_t n, GetBox box_at) {
  boxes_.reserve(n);
  for (size_t i = 0; i < n; ++i) boxes_.push_back(box_at(i));
  Build(n);
}

}  // namespace dcp
