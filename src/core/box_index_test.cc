#include "core/box_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace dcp {
namespace {

// The answer of testing every box: what candidates filtered by Intersect must give.
std::vector<size_t> BruteForce(const std::vector<Box>& boxes, const Box& q) {
  std::vector<size_t> out;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (Intersect(boxes[i], q)) out.push_back(i);
  }
  return out;
}

TEST(BoxIndexTest, MatchesBruteForceOnRandomGrids) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    // A random grid tiling of a 2-d or 3-d tensor, uneven splits included.
    const int rank = 1 + static_cast<int>(rng() % 3);
    std::vector<std::vector<int64_t>> cuts(rank);
    Shape shape = Shape::Zeros(rank);
    for (int d = 0; d < rank; ++d) {
      shape[d] = 1 + static_cast<int64_t>(rng() % 40);
      cuts[d] = {0, shape[d]};
      const int parts = static_cast<int>(rng() % 5);
      for (int p = 0; p < parts; ++p) cuts[d].push_back(static_cast<int64_t>(rng() % shape[d]));
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    }
    std::vector<Box> boxes;
    std::vector<size_t> at(rank, 0);
    while (true) {
      Box b{Shape::Zeros(rank), Shape::Zeros(rank)};
      for (int d = 0; d < rank; ++d) {
        b.offsets[d] = cuts[d][at[d]];
        b.lengths[d] = cuts[d][at[d] + 1] - cuts[d][at[d]];
      }
      boxes.push_back(b);
      int d = rank - 1;
      while (d >= 0 && ++at[d] + 1 == cuts[d].size()) at[d--] = 0;
      if (d < 0) break;
    }
    std::shuffle(boxes.begin(), boxes.end(), rng);
    const BoxIndex index(boxes.size(), [&](size_t i) -> const Box& { return boxes[i]; });
    for (int q = 0; q < 20; ++q) {
      Box query{Shape::Zeros(rank), Shape::Zeros(rank)};
      for (int d = 0; d < rank; ++d) {
        query.offsets[d] = static_cast<int64_t>(rng() % shape[d]);
        query.lengths[d] = 1 + static_cast<int64_t>(rng() % (shape[d] - query.offsets[d]));
      }
      std::vector<size_t> hits;
      for (size_t i : index.Candidates(query)) {
        if (Intersect(boxes[i], query)) hits.push_back(i);
      }
      ASSERT_EQ(hits, BruteForce(boxes, query)) << "seed " << seed << " query " << query.ToString();
    }
  }
}

TEST(BoxIndexTest, EmptyAndScalar) {
  const std::vector<Box> none;
  EXPECT_TRUE(BoxIndex(0, [&](size_t i) -> const Box& { return none[i]; })
                  .Candidates(Box{{0}, {4}})
                  .empty());
  // A 0-d box is one element: it is a candidate of the 0-d query.
  const std::vector<Box> scalar = {Box{}};
  EXPECT_EQ(BoxIndex(1, [&](size_t i) -> const Box& { return scalar[i]; }).Candidates(Box{}),
            (std::vector<size_t>{0}));
}

}  // namespace
}  // namespace dcp
