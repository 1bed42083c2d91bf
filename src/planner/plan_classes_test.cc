#include "planner/plan_classes.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace dcp::planner {
namespace {

TEST(PlanClassesTest, EqualHashesShareAClassNumberedByLowestRank) {
  // Ranks 0..5 with hashes b a b c a b: classes {0,2,5} (b), {1,4} (a), {3} (c).
  const std::vector<uint64_t> h = {20, 10, 20, 30, 10, 20};
  const PlanClasses pc = GroupByPlanHash(h);
  ASSERT_EQ(pc.holders.size(), 3u);
  EXPECT_EQ(pc.holders[0], (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(pc.holders[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(pc.holders[2], (std::vector<int>{3}));
  EXPECT_EQ(pc.class_of, (std::vector<int>{0, 1, 0, 2, 1, 0}));
  std::vector<int> senders;
  for (int r = 0; r < 6; ++r) {
    if (pc.IsSender(r)) senders.push_back(r);
  }
  EXPECT_EQ(senders, (std::vector<int>{0, 1, 3}));
}

TEST(PlanClassesTest, HashIsOfTheBytes) {
  EXPECT_EQ(PlanHash("abc"), PlanHash(std::string("abc")));
  EXPECT_NE(PlanHash("abc"), PlanHash("abd"));
  EXPECT_TRUE(GroupByPlanHash({}).holders.empty());
}

}  // namespace
}  // namespace dcp::planner
