#include "core/ascending_runs.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <utility>

namespace dcp {
namespace {

TEST(SortAscendingRuns, SortsLikeAStableSortWhateverTheRuns) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    // Up to 9 ascending runs of random lengths; keys repeat so that stability shows.
    std::vector<std::pair<int, int>> v;
    const int runs = static_cast<int>(rng() % 10);
    for (int r = 0; r < runs; ++r) {
      int key = static_cast<int>(rng() % 50);
      for (int n = static_cast<int>(rng() % 20); n > 0; --n) {
        v.push_back({key, static_cast<int>(v.size())});
        key += static_cast<int>(rng() % 3);
      }
    }
    auto less = [](const auto& a, const auto& b) { return a.first < b.first; };
    auto want = v;
    std::stable_sort(want.begin(), want.end(), less);
    SortAscendingRuns(v, less);
    ASSERT_EQ(v, want) << "trial " << trial;
  }
  std::vector<int> descending{5, 4, 3, 2, 1, 0};  // every element a run of its own
  SortAscendingRuns(descending, std::less<int>());
  EXPECT_EQ(descending, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace dcp
