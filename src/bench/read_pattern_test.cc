#include "bench/read_pattern.h"

#include <gtest/gtest.h>

namespace dcp::bench {
namespace {

uint64_t Bytes(const std::vector<PatternRun>& runs) {
  uint64_t n = 0;
  for (const PatternRun& r : runs) n += r.length;
  return n;
}

TEST(AssignPatternReadsTest, PrivateChunksGoToTheirRankAndAdjacentOnesJoin) {
  // File 0: [0,100) [100,200) [200,300) [300,400); rank 0 needs 0 and 1, rank 1 needs 2 and 3,
  // listed out of order.
  const std::vector<PatternChunk> chunks = {
      {0, 200, 100}, {0, 0, 100}, {0, 300, 100}, {0, 100, 100}};
  const auto runs = AssignPatternReads(chunks, {{1, 3}, {2, 0}});
  ASSERT_EQ(runs.size(), 2u);
  ASSERT_EQ(runs[0].size(), 1u);
  EXPECT_EQ(runs[0][0].offset, 0u);
  EXPECT_EQ(runs[0][0].length, 200u);
  ASSERT_EQ(runs[1].size(), 1u);
  EXPECT_EQ(runs[1][0].offset, 200u);
  EXPECT_EQ(runs[1][0].length, 200u);
}

TEST(AssignPatternReadsTest, SharedChunksAreReadOnceByTheLeastLoadedRankThatNeedsThem) {
  // Four chunks of 100 bytes needed by both ranks, then one only rank 2 needs; rank 1 needs
  // nothing. Shared ones alternate between ranks 0 and 2 (fewest bytes so far, ties lowest).
  const std::vector<PatternChunk> chunks = {
      {0, 0, 100}, {0, 100, 100}, {1, 0, 100}, {1, 100, 100}, {1, 200, 50}};
  const auto runs = AssignPatternReads(chunks, {{0, 1, 2, 3}, {}, {0, 1, 2, 3, 4}});
  EXPECT_EQ(Bytes(runs[0]) + Bytes(runs[1]) + Bytes(runs[2]), 450u);  // each byte once
  EXPECT_TRUE(runs[1].empty());
  EXPECT_EQ(Bytes(runs[0]), 200u);
  EXPECT_EQ(Bytes(runs[2]), 250u);
  ASSERT_EQ(runs[0].size(), 2u);
  EXPECT_EQ(runs[0][0].file, 0u);
  EXPECT_EQ(runs[0][0].offset, 0u);
  EXPECT_EQ(runs[0][1].file, 1u);
  EXPECT_EQ(runs[0][1].offset, 0u);
  // Rank 2's chunks 1 (file 0) and 3, 4 (file 1, adjacent: one run).
  ASSERT_EQ(runs[2].size(), 2u);
  EXPECT_EQ(runs[2][1].offset, 100u);
  EXPECT_EQ(runs[2][1].length, 150u);
}

TEST(AssignPatternReadsTest, ChunksNobodyNeedsAreNotReadAndRepeatsCountOnce) {
  const std::vector<PatternChunk> chunks = {{0, 0, 10}, {0, 10, 10}, {0, 20, 10}};
  const auto runs = AssignPatternReads(chunks, {{2, 2, 2}});
  ASSERT_EQ(runs[0].size(), 1u);
  EXPECT_EQ(runs[0][0].offset, 20u);
  EXPECT_EQ(runs[0][0].length, 10u);
}

}  // namespace
}  // namespace dcp::bench
