// Sorting a sequence made of runs that each ascend already.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dcp {

// Sorts `v` by merging its neighbouring ascending runs pairwise: n log(runs) rather than
// n log n. A plan's ranges come so (each chunk's rows in order, chunks one after another).
template <typename T, typename Less>
void SortAscendingRuns(std::vector<T>& v, Less less) {
  std::vector<size_t> bounds{0};
  for (size_t k = 1; k < v.size(); ++k) {
    if (less(v[k], v[k - 1])) bounds.push_back(k);
  }
  bounds.push_back(v.size());
  while (bounds.size() > 2) {
    std::vector<size_t> merged{0};
    for (size_t i = 0; i + 1 < bounds.size(); i += 2) {
      if (i + 2 == bounds.size()) {  // a run left without a partner this pass
        merged.push_back(bounds[i + 1]);
        continue;
      }
      std::inplace_merge(v.begin() + bounds[i], v.begin() + bounds[i + 1],
                         v.begin() + bounds[i + 2], less);
      merged.push_back(bounds[i + 2]);
    }
    bounds = std::move(merged);
  }
}

}  // namespace dcp
