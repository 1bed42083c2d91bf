#include "core/box_index.h"

#include <algorithm>
#include <numeric>

namespace dcp {

std::vector<size_t> BoxIndex::Candidates(const Box& query) const {
  std::vector<size_t> out;
  if (dim_ < 0 || query.rank() <= dim_) {
    out.resize(n_);
    std::iota(out.begin(), out.end(), size_t{0});
    return out;
  }
  // A box starting at or before query_lo - longest ends before the query; one starting at or
  // after query_hi begins after it.
  const int64_t lo = query.offsets[dim_] - longest_;
  const int64_t hi = query.offsets[dim_] + query.lengths[dim_];
  auto first = std::upper_bound(start_.begin(), start_.end(), lo);
  auto last = std::lower_bound(first, start_.end(), hi);
  for (auto it = first; it != last; ++it)
    out.push_back(order_[static_cast<size_t>(it - start_.begin())]);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dcp
