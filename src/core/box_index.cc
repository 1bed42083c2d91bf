#include "core/box_index.h"

#include <algorithm>
#include <numeric>

namespace dcp {

BoxIndex::BoxIndex(const std::vector<Box>& boxes) : boxes_(boxes) { Build(boxes_.size()); }

void BoxIndex::Build(size_t n) {
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), size_t{0});
  const int rank = n == 0 ? 0 : boxes_[0].rank();
  if (rank == 0) return;
  // The dimension with the most distinct offsets separates the boxes best.
  size_t best = 0;
  for (int d = 0; d < rank; ++d) {
    std::vector<int64_t> offs;
    offs.reserve(n);
    for (const Box& b : boxes_) offs.push_back(b.rank() == rank ? b.offsets[d] : 0);
    std::sort(offs.begin(), offs.end());
    const size_t distinct =
        static_cast<size_t>(std::unique(offs.begin(), offs.end()) - offs.begin());
    if (dim_ < 0 || distinct > best) {
      dim_ = d;
      best = distinct;
    }
  }
  for (const Box& b : boxes_) {
    if (b.rank() != rank) {  // mixed ranks never intersect a query of the other rank: scan all
      dim_ = -1;
      return;
    }
  }
  std::sort(order_.begin(), order_.end(),
            [&](size_t a, size_t b) { return boxes_[a].offsets[dim_] < boxes_[b].offsets[dim_]; });
  start_.reserve(n);
  for (size_t i : order_) {
    start_.push_back(boxes_[i].offsets[dim_]);
    longest_ = std::max(longest_, boxes_[i].lengths[dim_]);
  }
}

std::vector<size_t> BoxIndex::Intersecting(const Box& query) const {
  std::vector<size_t> out;
  if (dim_ < 0 || query.rank() != boxes_[0].rank()) {
    for (size_t i = 0; i < boxes_.size(); ++i) {
      if (Intersect(boxes_[i], query)) out.push_back(i);
    }
    return out;
  }
  // Candidates start after query_lo - longest (else they end before the query) and before
  // query_hi.
  const int64_t lo = query.offsets[dim_] - longest_;
  const int64_t hi = query.offsets[dim_] + query.lengths[dim_];
  auto first = std::upper_bound(start_.begin(), start_.end(), lo);
  auto last = std::lower_bound(first, start_.end(), hi);
  for (auto it = first; it != last; ++it) {
    const size_t i = order_[static_cast<size_t>(it - start_.begin())];
    if (Intersect(boxes_[i], query)) out.push_back(i);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dcp
