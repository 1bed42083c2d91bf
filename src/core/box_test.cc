#include "dcp/box.h"

#include <gtest/gtest.h>

#include <random>

namespace dcp {
namespace {

std::vector<Box> Slabs(int64_t rows, int64_t cols, int parts, int dim) {
  std::vector<Box> out;
  const int64_t n = dim == 0 ? rows : cols;
  for (int i = 0; i < parts; ++i) {
    Box b{{0, 0}, {rows, cols}};
    b.offsets[dim] = n * i / parts;
    b.lengths[dim] = n * (i + 1) / parts - b.offsets[dim];
    out.push_back(b);
  }
  return out;
}

TEST(BoxTest, IntersectHalfOpen) {
  auto r = Intersect(Box{{0, 0}, {4, 4}}, Box{{2, 3}, {4, 4}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, (Box{{2, 3}, {2, 1}}));
  EXPECT_FALSE(Intersect(Box{{0}, {4}}, Box{{4}, {2}}).has_value());        // touching: disjoint
  EXPECT_FALSE(Intersect(Box{{0}, {4}}, Box{{0, 0}, {4, 4}}).has_value());  // ranks differ
}

TEST(BoxTest, FindOverlapOnSlabsAlongEitherDimension) {
  for (int dim : {0, 1}) {
    auto boxes = Slabs(64, 64, 16, dim);
    EXPECT_FALSE(FindOverlap(boxes).has_value()) << dim;
    boxes.push_back(Box{{10, 10}, {1, 1}});  // inside some slab
    auto o = FindOverlap(boxes);
    ASSERT_TRUE(o.has_value()) << dim;
    EXPECT_EQ(o->second, boxes.size() - 1);
  }
}

TEST(BoxTest, FindOverlapTreatsIdenticalBoxesAsOverlappingAndEmptyOnesAsNot) {
  EXPECT_TRUE(FindOverlap({Box{{0}, {2}}, Box{{0}, {2}}}).has_value());
  EXPECT_FALSE(FindOverlap({Box{{2}, {0}}, Box{{2}, {0}}, Box{{0}, {4}}}).has_value());
  EXPECT_TRUE(FindOverlap({Box{Shape(), Shape()}, Box{Shape(), Shape()}}).has_value());  // 0-d
}

TEST(BoxTest, FindOverlapAgreesWithPairwiseOnRandomBoxes) {
  std::mt19937 rng(4242);
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<Box> boxes;
    const int n = 2 + static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) {
      Box b{{static_cast<int64_t>(rng() % 8), static_cast<int64_t>(rng() % 8)},
            {static_cast<int64_t>(rng() % 4), static_cast<int64_t>(rng() % 4)}};
      boxes.push_back(b);
    }
    bool pairwise = false;
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) {
        pairwise = pairwise || (!boxes[i].Empty() && !boxes[j].Empty() &&
                                Intersect(boxes[i], boxes[j]).has_value());
      }
    }
    EXPECT_EQ(FindOverlap(boxes).has_value(), pairwise) << "seed 4242, iteration " << iter;
  }
}

}  // namespace
}  // namespace dcp
