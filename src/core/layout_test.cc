#include "dcp/layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace dcp {
namespace {

std::vector<int64_t> Lengths(int64_t extent, int parts) {
  std::vector<int64_t> out;
  for (int i = 0; i < parts; ++i) out.push_back(TorchChunk(extent, parts, i).length);
  return out;
}

TEST(TorchChunkTest, EvenSplit) {
  EXPECT_EQ(Lengths(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(TorchChunk(8, 4, 3), (Interval{6, 2}));
}

TEST(TorchChunkTest, UnevenSplitMatchesTorchChunk) {
  // torch.arange(n).chunk(k) piece sizes, padded with empties to k as DTensor does.
  EXPECT_EQ(Lengths(6, 4), (std::vector<int64_t>{2, 2, 2, 0}));
  EXPECT_EQ(Lengths(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(Lengths(7, 3), (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(Lengths(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(Lengths(1, 3), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(Lengths(0, 2), (std::vector<int64_t>{0, 0}));
  // Empty pieces sit at the end of the range.
  EXPECT_EQ(TorchChunk(6, 4, 3), (Interval{6, 0}));
  EXPECT_EQ(TorchChunk(5, 4, 2), (Interval{4, 1}));
}

TEST(MeshCoordsTest, RowMajorLastDimFastest) {
  const std::vector<int> mesh = {2, 3};
  EXPECT_EQ(MeshCoords(0, mesh), (std::vector<int>{0, 0}));
  EXPECT_EQ(MeshCoords(1, mesh), (std::vector<int>{0, 1}));
  EXPECT_EQ(MeshCoords(3, mesh), (std::vector<int>{1, 0}));
  EXPECT_EQ(MeshCoords(5, mesh), (std::vector<int>{1, 2}));
  EXPECT_EQ(MeshSize(mesh), 6);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(MeshRank(MeshCoords(r, mesh), mesh), r);
  EXPECT_EQ(MeshCoords(0, {}), std::vector<int>{});
  EXPECT_EQ(MeshSize({}), 1);
}

TEST(ChunkForRankTest, ShardAndReplicate) {
  const Shape shape = {8, 6};
  // tp=2 shards dim 0, dp=2 replicates.
  const std::vector<int> mesh = {2, 2};
  const std::vector<Placement> pl = {Placement::Shard(0), Placement::Replicate()};
  auto a = ChunkForRank(shape, mesh, pl, {1, 0});
  auto b = ChunkForRank(shape, mesh, pl, {1, 1});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, (Box{{4, 0}, {4, 6}}));
  EXPECT_EQ(*a, *b);
}

TEST(ChunkForRankTest, TwoTensorDims) {
  auto r = ChunkForRank({8, 6}, {2, 3}, {Placement::Shard(0), Placement::Shard(1)}, {1, 2});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (Box{{4, 4}, {4, 2}}));
}

TEST(ChunkForRankTest, SameTensorDimSplitsHierarchically) {
  // DTensor: the second mesh dim splits the first one's piece, not the whole extent.
  // 10 over [S(0), S(0)] on 2x2: 10 -> 5,5 -> (3,2),(3,2).
  const std::vector<Placement> pl = {Placement::Shard(0), Placement::Shard(0)};
  std::vector<Box> got;
  for (int r = 0; r < 4; ++r) {
    auto b = ChunkForRank({10}, {2, 2}, pl, MeshCoords(r, {2, 2}));
    ASSERT_TRUE(b.ok());
    got.push_back(*b);
  }
  EXPECT_EQ(got[0], (Box{{0}, {3}}));
  EXPECT_EQ(got[1], (Box{{3}, {2}}));
  EXPECT_EQ(got[2], (Box{{5}, {3}}));
  EXPECT_EQ(got[3], (Box{{8}, {2}}));
}

TEST(ChunkForRankTest, HierarchicalUnevenGivesEmptyShards) {
  // 3 over [S(0), S(0)] on 2x2: 3 -> 2,1 -> (1,1),(1,0).
  const std::vector<Placement> pl = {Placement::Shard(0), Placement::Shard(0)};
  auto last = ChunkForRank({3}, {2, 2}, pl, {1, 1});
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->Empty());
  EXPECT_EQ(*last, (Box{{3}, {0}}));
  auto third = ChunkForRank({3}, {2, 2}, pl, {1, 0});
  EXPECT_EQ(*third, (Box{{2}, {1}}));
}

TEST(ChunkForRankTest, UnevenEmptyLastShard) {
  const std::vector<Placement> pl = {Placement::Shard(1)};
  auto r = ChunkForRank({4, 6}, {4}, pl, {3});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (Box{{0, 6}, {4, 0}}));
  EXPECT_TRUE(r->Empty());
  EXPECT_TRUE(r->WithinShape({4, 6}));
}

TEST(ChunkForRankTest, EmptyMeshIsWholeTensor) {
  auto r = ChunkForRank({3, 4}, {}, {}, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Box::Whole({3, 4}));
}

TEST(ChunkForRankTest, ScalarReplicated) {
  auto r = ChunkForRank(Shape{}, {2}, {Placement::Replicate()}, {1});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rank(), 0);
  EXPECT_EQ(r->NumElements(), 1u);
}

void ExpectInvalid(const Result<Box>& r, const std::string& fragment) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
}

TEST(ChunkForRankTest, InvalidArguments) {
  ExpectInvalid(ChunkForRank({4}, {2}, {Placement::Shard(1)}, {0}), "S(1)");
  ExpectInvalid(ChunkForRank({4}, {2}, {Placement::Shard(-2)}, {0}), "S(-2)");
  ExpectInvalid(ChunkForRank(Shape{}, {2}, {Placement::Shard(0)}, {0}), "0 dims");
  ExpectInvalid(ChunkForRank({4}, {2}, {Placement::Shard(0)}, {2}), "coordinate 2");
  ExpectInvalid(ChunkForRank({4}, {2}, {Placement::Shard(0)}, {-1}), "coordinate -1");
  ExpectInvalid(ChunkForRank({4}, {0}, {Placement::Shard(0)}, {0}), "size 0");
  ExpectInvalid(ChunkForRank({4}, {2, 2}, {Placement::Shard(0)}, {0, 0}), "1 placements");
  ExpectInvalid(ChunkForRank({4}, {2}, {Placement::Shard(0)}, {0, 0}), "2 coordinates");
  ExpectInvalid(ChunkForRank({-1}, {2}, {Placement::Replicate()}, {0}), "negative");
}

TEST(PlacementTest, Printing) {
  EXPECT_EQ(Placement::Shard(1).ToString(), "S(1)");
  EXPECT_EQ(Placement::Replicate().ToString(), "R");
  EXPECT_TRUE(Placement::Replicate().is_replicate());
  EXPECT_EQ(Placement::Shard(0), Placement::Shard(0));
  EXPECT_FALSE(Placement::Shard(0) == Placement::Replicate());
}

}  // namespace
}  // namespace dcp
