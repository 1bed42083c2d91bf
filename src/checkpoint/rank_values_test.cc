#include "checkpoint/rank_values.h"

#include <gtest/gtest.h>

namespace dcp::checkpoint {
namespace {

TEST(RankValues, NamesRoundTripAndOthersAreNotPerRank) {
  EXPECT_EQ(PerRankValueName("loader.pos", 12), "loader.pos.__dcp_rank_12");
  auto parsed = ParsePerRankValueName("loader.pos.__dcp_rank_12");
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->first, "loader.pos");
  EXPECT_EQ(parsed->second, 12);
  for (const char* other : {"loader.pos", ".__dcp_rank_1", "x.__dcp_rank_", "x.__dcp_rank_01",
                            "x.__dcp_rank_-1", "x.__dcp_rank_1a", "x.__dcp_rank_99999999999"}) {
    EXPECT_FALSE(ParsePerRankValueName(other)) << other;
  }
}

metadata::Metadata Saved(uint32_t world) {
  metadata::Metadata md;
  md.world_size = world;
  for (const char* name : {"a", "pos.__dcp_rank_0", "pos.__dcp_rank_2", "z"}) {
    md.bytes.push_back({.fqn = name});
  }
  md.bytes[1].byte_offset = 100;  // rank 0's
  md.bytes[2].byte_offset = 200;  // rank 2's
  return md;
}

// Each rank of a job as large as the saving one gets its own value; a rank that saved none,
// or any rank of another world, the lowest saving rank's, with a warning. Still sorted.
TEST(RankValues, EachRankPicksItsOwnWhereTheWorldMatches) {
  for (int rank : {0, 1, 2}) {
    metadata::Metadata md = Saved(3);
    std::vector<std::string> warnings;
    PickRankValues(md, rank, 3, &warnings);
    const metadata::BytesMeta* pos = md.FindBytes("pos");
    ASSERT_NE(pos, nullptr) << rank;
    EXPECT_EQ(pos->byte_offset, rank == 2 ? 200u : 100u) << rank;
    EXPECT_EQ(warnings.size(), rank == 1 ? 1u : 0u) << rank;
    EXPECT_TRUE(std::is_sorted(md.bytes.begin(), md.bytes.end(),
                               [](const auto& a, const auto& b) { return a.fqn < b.fqn; }));
  }
  metadata::Metadata md = Saved(3);
  std::vector<std::string> warnings;
  PickRankValues(md, 2, 4, &warnings);  // another world: rank 0's
  EXPECT_EQ(md.FindBytes("pos")->byte_offset, 100u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("'pos' was saved per rank"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("loads rank 0's value"), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace dcp::checkpoint
