// The boxes of a fixed set that may intersect a query box, without testing every one.
//
// Boxes are sorted along the dimension whose offsets vary most (the split dimension of slab
// layouts); a query looks only at boxes whose start along it lies in
// (query start - longest extent, query end), found by binary search. For slab and grid
// layouts that is O(log n + hits) instead of O(n): load planning at 1M stored chunks. The
// index keeps positions only, not the boxes: the caller intersects the candidates it returns.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dcp/box.h"

namespace dcp {

class BoxIndex {
 public:
  // `box_at(i)` for i < n: the boxes (all of one rank, e.g. a tensor's stored chunks), used
  // during construction only; return them by reference.
  template <typename GetBox>
  BoxIndex(size_t n, GetBox box_at);

  // Indices (ascending) of every box that may intersect `query`: a superset of those that do
  // (along the other dimensions nothing is checked).
  std::vector<size_t> Candidates(const Box& query) const;

 private:
  size_t n_ = 0;
  int dim_ = -1;                // sweep dimension; -1: every box is a candidate
  std::vector<size_t> order_;   // box indices by start along dim_
  std::vector<int64_t> start_;  // start along dim_, in order_
  int64_t longest_ = 0;         // largest extent along dim_
};

template <typename GetBox>
BoxIndex::BoxIndex(size_t n, GetBox box_at) : n_(n) {
  if (n == 0 || box_at(0).rank() == 0) return;
  const int rank = box_at(0).rank();
  for (size_t i = 0; i < n; ++i) {
    if (box_at(i).rank() != rank) return;  // mixed ranks: scan all
  }
  // The dimension with the most distinct offsets separates the boxes best.
  size_t best = 0;
  std::vector<int64_t> offs(n);
  for (int d = 0; d < rank; ++d) {
    for (size_t i = 0; i < n; ++i) offs[i] = box_at(i).offsets[d];
    std::sort(offs.begin(), offs.end());
    const auto distinct = static_cast<size_t>(std::unique(offs.begin(), offs.end()) - offs.begin());
    if (dim_ < 0 || distinct > best) {
      dim_ = d;
      best = distinct;
    }
  }
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = i;
  std::sort(order_.begin(), order_.end(),
            [&](size_t a, size_t b) { return box_at(a).offsets[dim_] < box_at(b).offsets[dim_]; });
  start_.reserve(n);
  for (size_t i : order_) {
    start_.push_back(box_at(i).offsets[dim_]);
    longest_ = std::max(longest_, box_at(i).lengths[dim_]);
  }
}

}  // namespace dcp
