#include "planner/broadcast_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace dcp::planner {
namespace {

ShardIdentity Shard(uint32_t tensor, int64_t offset, int64_t length, uint64_t nbytes,
                    bool broadcastable = true) {
  return {tensor, Box{{offset}, {length}}, nbytes, broadcastable};
}

// One class per rank.
std::vector<std::vector<int>> Singletons(int n) {
  std::vector<std::vector<int>> h(n);
  for (int r = 0; r < n; ++r) h[r] = {r};
  return h;
}

TEST(PlanBroadcastTest, TwoRanksAgreeOnOneReaderAndUniqueShardsStayPrivate) {
  LoadIdentity a{{Shard(0, 0, 4, 16), Shard(1, 0, 4, 16)}};
  LoadIdentity b{{Shard(0, 0, 4, 16), Shard(2, 0, 4, 16)}};
  BroadcastPlan p = PlanBroadcast({a, b}, Singletons(2), 2);
  ASSERT_EQ(p.shards.size(), 1u);
  EXPECT_EQ(p.shards[0].tensor, 0u);
  EXPECT_EQ(p.shards[0].reader, 0);
  EXPECT_EQ(p.groups[p.shards[0].group], (std::vector<int>{0, 1}));
  // Private bytes count toward each rank's reads.
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{32, 16}));
}

TEST(PlanBroadcastTest, FourEqualShardsOnFourRanksGetFourReaders) {
  LoadIdentity id;
  for (uint32_t t = 0; t < 4; ++t) id.shards.push_back(Shard(t, 0, 8, 64));
  BroadcastPlan p = PlanBroadcast({id, id, id, id}, Singletons(4), 4);
  ASSERT_EQ(p.shards.size(), 4u);
  std::vector<int> readers;
  for (const auto& s : p.shards) readers.push_back(s.reader);
  std::sort(readers.begin(), readers.end());
  EXPECT_EQ(readers, (std::vector<int>{0, 1, 2, 3}));
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0], (std::vector<int>{0, 1, 2, 3}));
}

TEST(PlanBroadcastTest, LargestFirstToTheLeastLoaded) {
  // Sizes 8, 4, 2, 1 on two ranks: 8 -> r0, 4 -> r1, 2 -> r1 (4 < 8), 1 -> r1 (6 < 8).
  LoadIdentity id{{Shard(0, 0, 1, 2), Shard(1, 0, 1, 8), Shard(2, 0, 1, 1), Shard(3, 0, 1, 4)}};
  BroadcastPlan p = PlanBroadcast({id, id}, Singletons(2), 2);
  ASSERT_EQ(p.shards.size(), 4u);
  // Execution order is (tensor, box), independent of size.
  for (uint32_t t = 0; t < 4; ++t) EXPECT_EQ(p.shards[t].tensor, t);
  EXPECT_EQ(p.shards[1].reader, 0);  // 8
  EXPECT_EQ(p.shards[3].reader, 1);  // 4
  EXPECT_EQ(p.shards[0].reader, 1);  // 2
  EXPECT_EQ(p.shards[2].reader, 1);  // 1
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{8, 7}));
}

TEST(PlanBroadcastTest, NotBroadcastableOnAnyRankMakesTheShardPrivate) {
  LoadIdentity a{{Shard(0, 0, 4, 16), Shard(1, 0, 4, 16)}};
  LoadIdentity b{{Shard(0, 0, 4, 16, /*broadcastable=*/false), Shard(1, 0, 4, 16)}};
  BroadcastPlan p = PlanBroadcast({a, b}, Singletons(2), 2);
  ASSERT_EQ(p.shards.size(), 1u);
  EXPECT_EQ(p.shards[0].tensor, 1u);
  // Each rank reads tensor 0 itself.
  EXPECT_EQ(p.read_bytes[0] + p.read_bytes[1], 16u * 2 + 16u);
}

TEST(PlanBroadcastTest, InterleavedGroupsSplitTheirShards) {
  // Ranks 0 and 2 hold piece 0 of two tensors, ranks 1 and 3 piece 1.
  LoadIdentity even{{Shard(0, 0, 4, 16), Shard(1, 0, 4, 16)}};
  LoadIdentity odd{{Shard(0, 4, 4, 16), Shard(1, 4, 4, 16)}};
  BroadcastPlan p = PlanBroadcast({even, odd, even, odd}, Singletons(4), 4);
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(p.groups[1], (std::vector<int>{1, 3}));
  std::vector<int> readers;
  for (const auto& s : p.shards) readers.push_back(s.reader);
  std::sort(readers.begin(), readers.end());
  EXPECT_EQ(readers, (std::vector<int>{0, 1, 2, 3}));  // each pair splits its two shards
}

TEST(PlanBroadcastTest, ResultDoesNotDependOnClassOrder) {
  std::mt19937 rng(7);
  std::vector<LoadIdentity> ids(4);
  for (uint32_t t = 0; t < 30; ++t) {
    for (int r = 0; r < 4; ++r) {
      if (rng() % 3) ids[r].shards.push_back(Shard(t, 0, 4, 1 + rng() % 1000));
    }
  }
  // Identities as every rank sees them: same sizes for the same shard.
  for (auto& id : ids) {
    for (auto& s : id.shards) s.nbytes = 100 + s.tensor * 37 % 11;
  }
  BroadcastPlan a = PlanBroadcast(ids, Singletons(4), 4);
  // Same ranks, classes listed in another order.
  std::vector<LoadIdentity> rev(ids.rbegin(), ids.rend());
  std::vector<std::vector<int>> holders{{3}, {2}, {1}, {0}};
  BroadcastPlan b = PlanBroadcast(rev, holders, 4);
  ASSERT_EQ(a.shards.size(), b.shards.size());
  for (size_t i = 0; i < a.shards.size(); ++i) {
    EXPECT_EQ(a.shards[i].tensor, b.shards[i].tensor);
    EXPECT_EQ(a.shards[i].reader, b.shards[i].reader);
    EXPECT_EQ(a.groups[a.shards[i].group], b.groups[b.shards[i].group]);
  }
  EXPECT_EQ(a.read_bytes, b.read_bytes);
}

TEST(PlanBroadcastTest, PlanClassesEqualPerRankPlans) {
  // 8 ranks, data-parallel over tp2: ranks {0,2,4,6} hold piece A, {1,3,5,7} piece B.
  LoadIdentity a{{Shard(0, 0, 4, 64), Shard(1, 0, 4, 32), Shard(2, 0, 2, 8)}};
  LoadIdentity b{{Shard(0, 4, 4, 64), Shard(1, 4, 4, 32), Shard(2, 2, 2, 8)}};
  BroadcastPlan classes = PlanBroadcast({a, b}, {{0, 2, 4, 6}, {1, 3, 5, 7}}, 8);
  BroadcastPlan per_rank = PlanBroadcast({a, b, a, b, a, b, a, b}, Singletons(8), 8);
  ASSERT_EQ(classes.shards.size(), per_rank.shards.size());
  for (size_t i = 0; i < classes.shards.size(); ++i) {
    EXPECT_EQ(classes.shards[i].reader, per_rank.shards[i].reader);
  }
  EXPECT_EQ(classes.read_bytes, per_rank.read_bytes);
}

// A [8, 8] F32 tensor stored as two row halves (as saved by tp2).
metadata::Metadata TwoRowHalves() {
  metadata::Metadata md;
  md.files = {{"f", 1024}};
  metadata::TensorMeta t{"w", DType::kF32, {8, 8}, {}};
  t.chunks.push_back({Box{{0, 0}, {4, 8}}, 0, 0, 128, 0});
  t.chunks.push_back({Box{{4, 0}, {4, 8}}, 0, 128, 128, 0});
  md.tensors.push_back(t);
  return md;
}

ShardIdentity Rows(int64_t offset, int64_t length) {
  return {0, Box{{offset, 0}, {length, 8}}, static_cast<uint64_t>(length) * 32, true};
}
ShardIdentity Cols(int64_t offset, int64_t length) {
  return {0, Box{{0, offset}, {8, length}}, static_cast<uint64_t>(length) * 32, true};
}

TEST(PlanBroadcastTest, ReshardWithChecksumsSharesEachStoredChunkOnce) {
  // tp2 -> tp4: each stored half feeds two ranks, which would each read it whole.
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Rows(0, 2)}}, {{Rows(2, 2)}}, {{Rows(4, 2)}}, {{Rows(6, 2)}}};
  BroadcastPlan p = PlanBroadcast(ids, Singletons(4), 4, {&md, /*whole_chunk_reads=*/true});
  EXPECT_TRUE(p.shards.empty());
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.groups[p.chunks[0].group], (std::vector<int>{0, 1}));
  EXPECT_EQ(p.groups[p.chunks[1].group], (std::vector<int>{2, 3}));
  EXPECT_EQ(p.chunks[0].reader, 0);
  EXPECT_EQ(p.chunks[1].reader, 2);
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{128, 0, 128, 0}));
}

TEST(PlanBroadcastTest, ASharedChunkIsReadWhereItsFileIs) {
  // As above, but only ranks 1 and 3 can read the file where they are (a memory tier's
  // restore: their hosts hold it): they read the halves for their partners.
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Rows(0, 2)}}, {{Rows(2, 2)}}, {{Rows(4, 2)}}, {{Rows(6, 2)}}};
  const std::vector<std::vector<bool>> readable{{false}, {true}, {false}, {true}};
  BroadcastPlanOptions o{&md, /*whole_chunk_reads=*/true};
  o.readable = &readable;
  BroadcastPlan p = PlanBroadcast(ids, Singletons(4), 4, o);
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].reader, 1);
  EXPECT_EQ(p.chunks[1].reader, 3);
  // Nobody can: the balanced choice, as without the constraint.
  const std::vector<std::vector<bool>> none(4, std::vector<bool>{false});
  o.readable = &none;
  p = PlanBroadcast(ids, Singletons(4), 4, o);
  EXPECT_EQ(p.chunks[0].reader, 0);
  EXPECT_EQ(p.chunks[1].reader, 2);
}

TEST(PlanBroadcastTest, ASharedShardIsReadByAMemberThatCanReadItsFiles) {
  // Ranks 0 and 1 both load the whole tensor (dp2); only rank 1 can read the file where it is.
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Rows(0, 8)}}, {{Rows(0, 8)}}};
  const std::vector<std::vector<bool>> readable{{false}, {true}};
  BroadcastPlanOptions o{&md, /*whole_chunk_reads=*/true};
  o.slab_bytes = 1 << 20;  // one piece
  BroadcastPlan p = PlanBroadcast(ids, Singletons(2), 2, o);
  ASSERT_EQ(p.shards.size(), 1u);
  EXPECT_EQ(p.shards[0].reader, 0);  // the balanced choice
  o.readable = &readable;
  p = PlanBroadcast(ids, Singletons(2), 2, o);
  ASSERT_EQ(p.shards.size(), 1u);
  EXPECT_EQ(p.shards[0].reader, 1);
}

TEST(PlanBroadcastTest, ASlabIsReadByAMemberThatCanReadItsFilesWhateverTheBalance) {
  // dp2 over an 8x8 tensor stored one row per chunk, rows 0-3 in file 0 and 4-7 in file 1;
  // every row is a slab. A member that cannot read a slab's file where it is never reads it
  // while another can: the bytes would be brought to it and then sent back.
  metadata::Metadata md;
  md.files = {{"f", 1024}, {"g", 1024}};
  metadata::TensorMeta t{"w", DType::kF32, {8, 8}, {}};
  for (int64_t row = 0; row < 8; ++row) {
    const uint32_t file = row < 4 ? 0 : 1;
    t.chunks.push_back({Box{{row, 0}, {1, 8}}, file, static_cast<uint64_t>(row % 4) * 32, 32, 0});
  }
  md.tensors.push_back(t);
  std::vector<LoadIdentity> ids{{{Rows(0, 8)}}, {{Rows(0, 8)}}};
  BroadcastPlanOptions o{&md, /*whole_chunk_reads=*/true};
  o.slab_bytes = 32;
  // Rank 0's host holds both files, rank 1's none (it lost its memory): rank 0 reads it all.
  const std::vector<std::vector<bool>> first{{true, true}, {false, false}};
  o.readable = &first;
  BroadcastPlan p = PlanBroadcast(ids, Singletons(2), 2, o);
  ASSERT_FALSE(p.shards.empty());
  for (const SharedShard& s : p.shards) EXPECT_EQ(s.reader, 0) << s.slab.ToString();
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{256, 0}));
  // Both hold file 0, only rank 1 file 1: the rows of file 1 are rank 1's, which leaves those
  // of file 0 to rank 0 -- each slab read where its file is, nothing brought.
  const std::vector<std::vector<bool>> second{{true, false}, {true, true}};
  o.readable = &second;
  p = PlanBroadcast(ids, Singletons(2), 2, o);
  for (const SharedShard& s : p.shards) {
    EXPECT_EQ(s.reader, s.slab.offsets[0] < 4 ? 0 : 1) << s.slab.ToString();
  }
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{128, 128}));
}

TEST(PlanBroadcastTest, AChunkNoConsumerCanReadIsSentByARankThatCan) {
  // tp2 -> tp4 as above; ranks 0 and 1 (one host's) cannot read the file, rank 3 can: it
  // reads both halves (it needs the second) and sends the first to ranks 0 and 1, which
  // are no group of it otherwise.
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Rows(0, 2)}}, {{Rows(2, 2)}}, {{Rows(4, 2)}}, {{Rows(6, 2)}}};
  const std::vector<std::vector<bool>> readable{{false}, {false}, {false}, {true}};
  const std::vector<uint64_t> hosts{0, 0, 1, 1};
  BroadcastPlanOptions o{&md, /*whole_chunk_reads=*/true, &hosts};
  o.readable = &readable;
  BroadcastPlan p = PlanBroadcast(ids, Singletons(4), 4, o);
  EXPECT_TRUE(p.shards.empty());
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].reader, 3);
  EXPECT_EQ(p.groups[p.chunks[0].group], (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(p.chunks[1].reader, 3);
  EXPECT_EQ(p.groups[p.chunks[1].group], (std::vector<int>{2, 3}));
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{0, 0, 0, 256}));
  // A private shard too: rank 0 alone loads the first half, which only rank 1 can read.
  std::vector<LoadIdentity> one{{{Rows(0, 4)}}, {}};
  const std::vector<std::vector<bool>> other{{false}, {true}};
  o.readable = &other;
  o.host_of_rank = nullptr;
  p = PlanBroadcast(one, Singletons(2), 2, o);
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].reader, 1);
  EXPECT_EQ(p.groups[p.chunks[0].group], (std::vector<int>{0, 1}));
  // Nobody can read it: rank 0 reads it (what it reads is brought to it first).
  const std::vector<std::vector<bool>> none(2, std::vector<bool>{false});
  o.readable = &none;
  p = PlanBroadcast(one, Singletons(2), 2, o);
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{128, 0}));
}

TEST(PlanBroadcastTest, AShardNoHolderCanReadGoesFromAReaderToAllHolders) {
  // Ranks 0 and 1 both load the whole tensor (dp2), neither can read the file; rank 2 (which
  // loads nothing) can. One hop: rank 2 sends each stored half to both, rather than to one
  // of them which would then pass it on.
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Rows(0, 8)}}, {{Rows(0, 8)}}, {}};
  const std::vector<std::vector<bool>> readable{{false}, {false}, {true}};
  BroadcastPlanOptions o{&md, /*whole_chunk_reads=*/true};
  o.slab_bytes = 1 << 20;
  o.readable = &readable;
  BroadcastPlan p = PlanBroadcast(ids, Singletons(3), 3, o);
  EXPECT_TRUE(p.shards.empty());
  ASSERT_EQ(p.chunks.size(), 2u);
  for (const SharedChunk& c : p.chunks) {
    EXPECT_EQ(c.reader, 2);
    EXPECT_EQ(p.groups[c.group], (std::vector<int>{0, 1, 2}));
  }
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{0, 0, 256}));
}

TEST(PlanBroadcastTest, AShardEachHolderCanReadPartOfGoesChunkByChunkFromWhereEachIs) {
  // dp2, the halves in two files; rank 0's host holds the first, rank 1's the second: neither
  // can read the whole shard, so each sends the half it can read to the other.
  auto md = TwoRowHalves();
  md.files.push_back({"g", 1024});
  md.tensors[0].chunks[1].file = 1;
  md.tensors[0].chunks[1].byte_offset = 0;
  std::vector<LoadIdentity> ids{{{Rows(0, 8)}}, {{Rows(0, 8)}}};
  const std::vector<std::vector<bool>> readable{{true, false}, {false, true}};
  BroadcastPlanOptions o{&md, /*whole_chunk_reads=*/true};
  o.slab_bytes = 1 << 20;
  o.readable = &readable;
  BroadcastPlan p = PlanBroadcast(ids, Singletons(2), 2, o);
  EXPECT_TRUE(p.shards.empty());
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].reader, 0);
  EXPECT_EQ(p.chunks[1].reader, 1);
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{128, 128}));
  // One holder can read both files: the shard is shared as before, read by it.
  const std::vector<std::vector<bool>> one{{true, true}, {false, true}};
  o.readable = &one;
  p = PlanBroadcast(ids, Singletons(2), 2, o);
  ASSERT_EQ(p.shards.size(), 1u);
  EXPECT_EQ(p.shards[0].reader, 0);
  EXPECT_TRUE(p.chunks.empty());
}

TEST(PlanBroadcastTest, ContiguousPartialReadsWithoutChecksumsAreNotShared) {
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Rows(0, 2)}}, {{Rows(2, 2)}}, {{Rows(4, 2)}}, {{Rows(6, 2)}}};
  BroadcastPlan p = PlanBroadcast(ids, Singletons(4), 4, {&md, /*whole_chunk_reads=*/false});
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{64, 64, 64, 64}));
}

TEST(PlanBroadcastTest, ColumnSlicesWithoutChecksumsAreShared) {
  // Each rank's column quarter spans almost all of both stored halves.
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Cols(0, 2)}}, {{Cols(2, 2)}}, {{Cols(4, 2)}}, {{Cols(6, 2)}}};
  BroadcastPlan p = PlanBroadcast(ids, Singletons(4), 4, {&md, /*whole_chunk_reads=*/false});
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.groups[p.chunks[0].group], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_NE(p.chunks[0].reader, p.chunks[1].reader);  // balanced
  uint64_t total = 0;
  for (uint64_t b : p.read_bytes) total += b;
  EXPECT_EQ(total, 256u);
}

TEST(PlanBroadcastTest, ColumnSlicesOfASmallGroupGoAsParts) {
  // As above: a group of four, each member needing a column quarter of each stored half.
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Cols(0, 2)}}, {{Cols(2, 2)}}, {{Cols(4, 2)}}, {{Cols(6, 2)}}};
  BroadcastPlan p = PlanBroadcast(ids, Singletons(4), 4, {&md, /*whole_chunk_reads=*/false});
  ASSERT_EQ(p.chunks.size(), 2u);
  for (const SharedChunk& c : p.chunks) {
    ASSERT_EQ(c.parts.size(), 4u);  // one per member, in the group's order
    const int64_t row = c.stored == 0 ? 0 : 4;
    for (int64_t m = 0; m < 4; ++m) {
      EXPECT_EQ(c.parts[m], (std::vector<Box>{Box{{row, 2 * m}, {4, 2}}})) << "member " << m;
    }
  }
}

// A [12, 8] F32 tensor stored whole, with one checksum (as saved by dp).
metadata::Metadata OneWholeChunk() {
  metadata::Metadata md;
  md.files = {{"f", 384}};
  metadata::TensorMeta t{"w", DType::kF32, {12, 8}, {}};
  t.chunks.push_back({Box{{0, 0}, {12, 8}}, 0, 0, 384, 0});
  md.tensors.push_back(t);
  return md;
}

TEST(PlanBroadcastTest, AChunkGoesAsPartsWhereTheOthersNeedNoMoreThanItsBytes) {
  // Six ranks each load two rows (tp6 from dp): each would read the chunk whole to verify
  // it, so one reads it and the other five need 320 of its 384 bytes: parts.
  const auto md = OneWholeChunk();
  std::vector<LoadIdentity> ids;
  for (int64_t r = 0; r < 6; ++r) ids.push_back({{{0, Box{{2 * r, 0}, {2, 8}}, 64, true}}});
  BroadcastPlan p = PlanBroadcast(ids, Singletons(6), 6, {&md, /*whole_chunk_reads=*/true});
  ASSERT_EQ(p.chunks.size(), 1u);
  const SharedChunk& c = p.chunks[0];
  EXPECT_EQ(p.groups[c.group], (std::vector<int>{0, 1, 2, 3, 4, 5}));
  ASSERT_EQ(c.parts.size(), 6u);
  for (int64_t m = 0; m < 6; ++m) {
    EXPECT_EQ(c.parts[m], (std::vector<Box>{Box{{2 * m, 0}, {2, 8}}})) << "member " << m;
  }
  // Overlapping windows of seven rows instead: the other five need 1,120 bytes, more than a
  // broadcast of the chunk sends, in a group of more than kPartsMaxMembers.
  ids.clear();
  for (int64_t r = 0; r < 6; ++r) ids.push_back({{{0, Box{{r, 0}, {7, 8}}, 224, true}}});
  p = PlanBroadcast(ids, Singletons(6), 6, {&md, /*whole_chunk_reads=*/true});
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.groups[p.chunks[0].group].size(), 6u);
  EXPECT_TRUE(p.chunks[0].parts.empty());
}

TEST(PartSpansTest, RowMajorRunsOfTheRegionsInsideTheChunkSortedAndMerged) {
  const Box chunk{{4, 0}, {4, 8}};  // F32: 32 bytes a row
  EXPECT_EQ(PartSpans(DType::kF32, chunk, {Box{{5, 0}, {2, 8}}}),
            (std::vector<ByteSpan>{{32, 64}}));
  EXPECT_EQ(PartSpans(DType::kF32, chunk, {Box{{4, 2}, {4, 2}}}),
            (std::vector<ByteSpan>{{8, 8}, {40, 8}, {72, 8}, {104, 8}}));
  // Given out of order, adjacent and overlapping: one span.
  EXPECT_EQ(PartSpans(DType::kF32, chunk,
                      {Box{{6, 0}, {1, 8}}, Box{{4, 0}, {2, 8}}, Box{{5, 4}, {1, 4}}}),
            (std::vector<ByteSpan>{{0, 96}}));
  EXPECT_TRUE(PartSpans(DType::kF32, chunk, {}).empty());
}

TEST(PlanBroadcastTest, IdentityRoundTripAndGarbage) {
  LoadIdentity id{{Shard(3, 2, 5, 40, false), {7, Box{{1, 2}, {3, 4}}, 24, true}}};
  auto back = DecodeLoadIdentity(EncodeLoadIdentity(id));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->shards, id.shards);
  std::string enc = EncodeLoadIdentity(id);
  for (size_t n = 0; n < enc.size(); ++n) {
    EXPECT_FALSE(DecodeLoadIdentity(enc.substr(0, n)).ok()) << n;
  }
}

}  // namespace
}  // namespace dcp::planner

namespace dcp::planner {
namespace {

TEST(PlanBroadcastTest, ReplicasOnOneHostReadThroughThePageCache) {
  LoadIdentity id{{Shard(0, 0, 4, 64), Shard(1, 0, 4, 64)}};
  const std::vector<uint64_t> one_host{7, 7, 7, 7};
  BroadcastPlan p = PlanBroadcast({id, id, id, id}, Singletons(4), 4, {nullptr, true, &one_host});
  EXPECT_TRUE(p.shards.empty());
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>{128, 128, 128, 128}));
  // Two hosts: the same replicas span them and are broadcast.
  const std::vector<uint64_t> two_hosts{1, 1, 2, 2};
  p = PlanBroadcast({id, id, id, id}, Singletons(4), 4, {nullptr, true, &two_hosts});
  EXPECT_EQ(p.shards.size(), 2u);
  // Pairs within hosts: {0,1} hold shard A, {2,3} shard B: nothing spans hosts.
  LoadIdentity a{{Shard(0, 0, 4, 64)}}, b{{Shard(0, 4, 4, 64)}};
  p = PlanBroadcast({a, a, b, b}, Singletons(4), 4, {nullptr, true, &two_hosts});
  EXPECT_TRUE(p.shards.empty());
  p = PlanBroadcast({a, b, a, b}, Singletons(4), 4, {nullptr, true, &two_hosts});
  EXPECT_EQ(p.shards.size(), 2u);
}

TEST(PlanBroadcastTest, StoredChunksAreSharedOnlyAcrossHosts) {
  const auto md = TwoRowHalves();
  std::vector<LoadIdentity> ids{{{Rows(0, 2)}}, {{Rows(2, 2)}}, {{Rows(4, 2)}}, {{Rows(6, 2)}}};
  const std::vector<uint64_t> pairs{1, 1, 2, 2};  // consumers {0,1} and {2,3} share hosts
  BroadcastPlan p = PlanBroadcast(ids, Singletons(4), 4, {&md, true, &pairs});
  EXPECT_TRUE(p.chunks.empty());
  const std::vector<uint64_t> split{1, 2, 1, 2};
  p = PlanBroadcast(ids, Singletons(4), 4, {&md, true, &split});
  EXPECT_EQ(p.chunks.size(), 2u);
}

}  // namespace
}  // namespace dcp::planner

namespace dcp::planner {
namespace {

// The entries of `p` for (tensor, box), in execution order.
std::vector<SharedShard> EntriesOf(const BroadcastPlan& p, uint32_t tensor, const Box& box) {
  std::vector<SharedShard> out;
  for (const SharedShard& s : p.shards) {
    if (s.tensor == tensor && s.box == box) out.push_back(s);
  }
  return out;
}

// Every shared shard's slabs tile it along dimension 0 exactly once, each with its bytes.
void ExpectSlabsTile(const BroadcastPlan& p) {
  for (size_t i = 0; i < p.shards.size();) {
    const SharedShard& first = p.shards[i];
    const uint64_t rows = static_cast<uint64_t>(first.box.lengths[0]);
    int64_t at = first.box.offsets[0];
    uint64_t bytes = 0;
    for (;
         i < p.shards.size() && p.shards[i].tensor == first.tensor && p.shards[i].box == first.box;
         ++i) {
      const SharedShard& s = p.shards[i];
      EXPECT_EQ(s.slab.offsets[0], at) << s.box.ToString();
      for (int d = 1; d < s.box.rank(); ++d) {
        EXPECT_EQ(s.slab.offsets[d], s.box.offsets[d]);
        EXPECT_EQ(s.slab.lengths[d], s.box.lengths[d]);
      }
      at += s.slab.lengths[0];
      bytes += s.nbytes;
      EXPECT_GE(s.reader, 0);
      EXPECT_TRUE(std::binary_search(p.groups[s.group].begin(), p.groups[s.group].end(), s.reader));
    }
    EXPECT_EQ(at, first.box.offsets[0] + first.box.lengths[0]) << first.box.ToString();
    EXPECT_EQ(bytes % rows, 0u);
  }
}

TEST(PlanBroadcastTest, LargeShardIsCutIntoSlabsOnePerReader) {
  // One 64 KiB shard of 64 rows held by 4 ranks: four readers of 16 rows each, one
  // broadcast each (consecutive slabs of one reader travel together).
  LoadIdentity id{{Shard(0, 0, 64, 64 * 1024)}};
  BroadcastPlan p = PlanBroadcast({id}, {{0, 1, 2, 3}}, 4, {.slab_bytes = 1024});
  ExpectSlabsTile(p);
  ASSERT_EQ(p.shards.size(), 4u);
  std::set<int> readers;
  for (const auto& s : p.shards) {
    EXPECT_EQ(s.slab.lengths[0], 16);
    EXPECT_EQ(s.nbytes, 16u * 1024);
    readers.insert(s.reader);
  }
  EXPECT_EQ(readers.size(), 4u);
  EXPECT_EQ(p.read_bytes, (std::vector<uint64_t>(4, 16 * 1024)));
  // Slabs off (larger than the shard): one reader, as before.
  p = PlanBroadcast({id}, {{0, 1, 2, 3}}, 4, {.slab_bytes = UINT64_MAX});
  ASSERT_EQ(p.shards.size(), 1u);
  EXPECT_EQ(p.shards[0].slab, p.shards[0].box);
}

TEST(PlanBroadcastTest, SlabsKeepRandomJobsBalancedAndDoNotDependOnClassOrder) {
  // 16 ranks as tp2 x dp8 (classes {0,2,..}, {1,3,..}): each class holds its tp half of
  // some tensors, and both hold the whole of others; sizes from one row to 40% of a fair
  // share, in rows of 1 KiB.
  for (unsigned seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    LoadIdentity even, odd;
    for (uint32_t t = 0; t < 60; ++t) {
      const int64_t rows = 1 + static_cast<int64_t>(rng() % 4000);
      if (rng() % 2) {
        even.shards.push_back(Shard(t, 0, rows, static_cast<uint64_t>(rows) * 1024));
        odd.shards.push_back(Shard(t, rows, rows, static_cast<uint64_t>(rows) * 1024));
      } else {
        even.shards.push_back(Shard(t, 0, rows, static_cast<uint64_t>(rows) * 1024));
        odd.shards.push_back(Shard(t, 0, rows, static_cast<uint64_t>(rows) * 1024));
      }
    }
    std::vector<std::vector<int>> holders(2);
    for (int r = 0; r < 16; ++r) holders[r % 2].push_back(r);
    const BroadcastPlanOptions opts{.slab_bytes = 16 * 1024};
    BroadcastPlan p = PlanBroadcast({even, odd}, holders, 16, opts);
    ExpectSlabsTile(p);
    uint64_t sum = 0, max = 0;
    for (uint64_t b : p.read_bytes) {
      sum += b;
      max = std::max(max, b);
    }
    uint64_t unique = 0;
    for (const auto& s : p.shards) unique += s.nbytes;
    EXPECT_EQ(sum, unique);  // every shared byte read once
    EXPECT_LE(static_cast<double>(max), 1.2 * static_cast<double>(sum) / 16);
    // The same job with its classes listed the other way round.
    BroadcastPlan q = PlanBroadcast({odd, even}, {holders[1], holders[0]}, 16, opts);
    ASSERT_EQ(p.shards.size(), q.shards.size());
    for (size_t i = 0; i < p.shards.size(); ++i) {
      EXPECT_EQ(p.shards[i].slab, q.shards[i].slab);
      EXPECT_EQ(p.shards[i].reader, q.shards[i].reader);
      EXPECT_EQ(p.groups[p.shards[i].group], q.groups[q.shards[i].group]);
    }
    EXPECT_EQ(p.read_bytes, q.read_bytes);
  }
}

TEST(PlanBroadcastTest, WithChecksumsSlabsEndOnlyBetweenStoredChunks) {
  // Tensor 0 [64, 8] F32 stored as rows [0, 10), [10, 30), [30, 64); tensor 1 as column
  // halves, which no row cut avoids crossing. Four ranks want both whole.
  metadata::Metadata md;
  md.files = {{"f", 4096}};
  metadata::TensorMeta rows{"a", DType::kF32, {64, 8}, {}};
  rows.chunks.push_back({Box{{0, 0}, {10, 8}}, 0, 0, 320, 0});
  rows.chunks.push_back({Box{{10, 0}, {20, 8}}, 0, 320, 640, 0});
  rows.chunks.push_back({Box{{30, 0}, {34, 8}}, 0, 960, 1088, 0});
  metadata::TensorMeta cols{"b", DType::kF32, {64, 8}, {}};
  cols.chunks.push_back({Box{{0, 0}, {64, 4}}, 0, 2048, 1024, 0});
  cols.chunks.push_back({Box{{0, 4}, {64, 4}}, 0, 3072, 1024, 0});
  md.tensors = {rows, cols};
  LoadIdentity id{{{0, Box{{0, 0}, {64, 8}}, 2048, true}, {1, Box{{0, 0}, {64, 8}}, 2048, true}}};
  BroadcastPlan p = PlanBroadcast({id}, {{0, 1, 2, 3}}, 4,
                                  {&md, /*whole_chunk_reads=*/true, nullptr, /*slab_bytes=*/32});
  ExpectSlabsTile(p);
  const auto a = EntriesOf(p, 0, Box{{0, 0}, {64, 8}});
  ASSERT_GT(a.size(), 1u);
  for (const auto& s : a) {
    const int64_t start = s.slab.offsets[0];
    EXPECT_TRUE(start == 0 || start == 10 || start == 30) << s.slab.ToString();
  }
  EXPECT_EQ(EntriesOf(p, 1, Box{{0, 0}, {64, 8}}).size(), 1u);
  EXPECT_TRUE(p.chunks.empty());  // no stored chunk is read by two readers
  uint64_t sum = 0;
  for (uint64_t b : p.read_bytes) sum += b;
  EXPECT_EQ(sum, 4096u);  // every stored byte once
  // Without checksums a slab may end anywhere; the stored bytes are still read once.
  p = PlanBroadcast({id}, {{0, 1, 2, 3}}, 4, {&md, false, nullptr, 32});
  ExpectSlabsTile(p);
  EXPECT_GT(EntriesOf(p, 1, Box{{0, 0}, {64, 8}}).size(), 1u);
  sum = 0;
  for (uint64_t b : p.read_bytes) sum += b;
  EXPECT_EQ(sum, 4096u);
}

// Plans one tensor of `chunks` (format 3, 256-byte blocks; a chunk given `blocks` false has one
// checksum) whose `shard` four ranks on four hosts all want, with 256-byte slabs; returns the
// rows (absolute) where its entries start. Every stored byte it needs is read once and no
// stored chunk is shared whole.
std::vector<int64_t> SlabStarts(const Shape& shape, const std::vector<std::pair<Box, bool>>& chunks,
                                const Box& shard) {
  metadata::Metadata md;
  md.block_size = 256;
  metadata::TensorMeta t{"t", DType::kF32, shape, {}};
  uint64_t at = 0, needed = 0;
  for (const auto& [box, blocks] : chunks) {
    const auto bytes = static_cast<uint64_t>(box.NumElements()) * 4;
    t.chunks.push_back(
        {box, 0, at, bytes, 0,
         blocks ? std::vector<uint64_t>(NumBlocks(256, bytes), 1) : std::vector<uint64_t>()});
    at += bytes;
  }
  md.files = {{"f", at}};
  md.tensors = {t};
  const auto nbytes = static_cast<uint64_t>(shard.NumElements()) * 4;
  LoadIdentity id{{{0, shard, nbytes, true}}};
  BroadcastPlan p = PlanBroadcast({id}, {{0, 1, 2, 3}}, 4,
                                  {&md, /*whole_chunk_reads=*/true, nullptr, /*slab_bytes=*/256});
  ExpectSlabsTile(p);
  EXPECT_TRUE(p.chunks.empty());
  for (const auto& c : t.chunks) {
    auto region = Intersect(shard, c.box);
    if (region && !region->Empty())
      needed += c.byte_length;  // every test shard covers chunks whole or reads them whole
  }
  uint64_t sum = 0;
  for (uint64_t r : p.read_bytes) sum += r;
  EXPECT_LE(sum, needed);
  std::vector<int64_t> starts;
  for (const auto& e : EntriesOf(p, 0, shard)) starts.push_back(e.slab.offsets[0]);
  return starts;
}

TEST(PlanBroadcastTest, WithBlockChecksumsSlabsEndAtBlocksInsideStoredChunks) {
  // [64, 8] F32 rows are 32 bytes: a block every 8 rows of a chunk. Stored as rows [0, 10) and
  // [10, 64): cuts at 8 (inside the first), 10 (between), 10 + 8k (inside the second).
  const Box all{{0, 0}, {64, 8}};
  auto starts =
      SlabStarts({64, 8}, {{Box{{0, 0}, {10, 8}}, true}, {Box{{10, 0}, {54, 8}}, true}}, all);
  ASSERT_GT(starts.size(), 2u);
  bool inside = false;
  for (int64_t r : starts) {
    inside = inside || (r > 10 && r < 64);
    EXPECT_TRUE(r == 0 || r == 8 || r == 10 || (r > 10 && (r - 10) % 8 == 0)) << r;
  }
  EXPECT_TRUE(inside);
  // A shard starting inside its one stored chunk (rows [4, 64) of [0, 64)): cuts where the
  // chunk's blocks start, rows 8k.
  starts = SlabStarts({64, 8}, {{all, true}}, Box{{4, 0}, {60, 8}});
  ASSERT_GT(starts.size(), 2u);
  EXPECT_EQ(starts[0], 4);
  for (size_t i = 1; i < starts.size(); ++i) EXPECT_EQ(starts[i] % 8, 0) << starts[i];
  // Column pieces of 4 and 8 columns (16- and 32-byte rows: blocks every 16 and 8 rows): a cut
  // must start a block of both, rows 16k.
  starts = SlabStarts({64, 12}, {{Box{{0, 0}, {64, 4}}, true}, {Box{{0, 4}, {64, 8}}, true}},
                      Box{{0, 0}, {64, 12}});
  ASSERT_GT(starts.size(), 1u);
  for (int64_t r : starts) EXPECT_EQ(r % 16, 0) << r;
  // Beside a piece with one checksum (read whole), nothing is cut.
  starts = SlabStarts({64, 8}, {{Box{{0, 0}, {64, 4}}, true}, {Box{{0, 4}, {64, 4}}, false}}, all);
  EXPECT_EQ(starts, std::vector<int64_t>{0});
  // One checksum per chunk (formats 1, 2) everywhere: cuts only between chunks.
  starts =
      SlabStarts({64, 8}, {{Box{{0, 0}, {10, 8}}, false}, {Box{{10, 0}, {54, 8}}, false}}, all);
  for (int64_t r : starts) EXPECT_TRUE(r == 0 || r == 10) << r;
}

TEST(ScheduleBroadcastsTest, BatchesPerGroupAndReaderInIssueOrder) {
  BroadcastPlan p;
  p.groups = {{0, 1}, {0, 1, 2}};
  // Limit 10: a (g0,r0) 4 + 4 fit; the third 4 overflows and closes that batch; a 12-byte
  // chunk goes alone when reached; (g1,r2) stays open until the end.
  p.chunks = {{0, 0, 4, 0, 0}, {1, 0, 4, 1, 2}, {2, 0, 4, 0, 0}, {3, 0, 12, 0, 1}, {4, 0, 4, 0, 0}};
  auto ops = ScheduleBroadcasts(p, 10);
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[0].items, (std::vector<uint32_t>{3}));     // 12 bytes: alone
  EXPECT_EQ(ops[1].items, (std::vector<uint32_t>{0, 2}));  // closed by chunk 4
  EXPECT_EQ(ops[1].bytes, 8u);
  EXPECT_EQ(ops[2].items, (std::vector<uint32_t>{1}));  // (g1, r2), opened first
  EXPECT_EQ(ops[3].items, (std::vector<uint32_t>{4}));
  // Batching off: one operation per chunk, in order.
  ops = ScheduleBroadcasts(p, 0);
  ASSERT_EQ(ops.size(), 5u);
  for (uint32_t i = 0; i < ops.size(); ++i) EXPECT_EQ(ops[i].items, (std::vector<uint32_t>{i}));
  // Chunk 2 sent as parts: it batches apart from the (g0, r0) chunks broadcast whole.
  p.chunks[2].parts = {{Box{{0}, {1}}}, {Box{{1}, {1}}}};
  ops = ScheduleBroadcasts(p, 10);
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[0].items, (std::vector<uint32_t>{3}));
  EXPECT_EQ(ops[1].items, (std::vector<uint32_t>{0, 4}));
  EXPECT_EQ(ops[2].items, (std::vector<uint32_t>{1}));
  EXPECT_EQ(ops[3].items, (std::vector<uint32_t>{2}));
}

// Group 0 {0, 1}: eight 10-byte shards read by 0 and 1 in turn; group 1 {1, 2}: two.
BroadcastPlan EightAndTwo() {
  BroadcastPlan p;
  p.groups = {{0, 1}, {1, 2}};
  for (uint32_t t = 0; t < 10; ++t) {
    const uint32_t g = t < 8 ? 0 : 1;
    const int reader = g == 0 ? static_cast<int>(t % 2) : 1 + static_cast<int>(t % 2);
    p.shards.push_back({t, Box{{0}, {10}}, Box{{0}, {10}}, 10, g, reader});
  }
  return p;
}

// Every shard in exactly one op of its own group, each group's ops in global order, and the
// ops sorted by (round, group) with rounds numbered 0, 1, ... per group.
uint64_t BytesOf(const BroadcastPlan& p, const GatherOp& op) {
  uint64_t bytes = 0;
  for (uint32_t i : op.items) bytes += p.shards[i].nbytes;
  return bytes;
}

void ExpectGathersCover(const BroadcastPlan& p, const std::vector<GatherOp>& ops) {
  std::vector<int> seen(p.shards.size(), 0);
  std::vector<int64_t> last(p.groups.size(), -1);
  std::vector<uint32_t> rounds(p.groups.size(), 0);
  for (size_t k = 0; k < ops.size(); ++k) {
    const GatherOp& op = ops[k];
    if (k > 0) {
      EXPECT_LT(std::tie(ops[k - 1].round, ops[k - 1].group), std::tie(op.round, op.group));
    }
    EXPECT_EQ(op.round, rounds[op.group]++);
    for (uint32_t i : op.items) {
      EXPECT_EQ(p.shards[i].group, op.group);
      EXPECT_GT(static_cast<int64_t>(i), last[op.group]);
      last[op.group] = i;
      ++seen[i];
    }
  }
  EXPECT_EQ(seen, std::vector<int>(p.shards.size(), 1));
}

TEST(ScheduleGathersTest, AFewRoundsPerGroupInOneGlobalOrder) {
  const BroadcastPlan p = EightAndTwo();
  auto ops = ScheduleGathers(p, {.rounds = 4});
  ExpectGathersCover(p, ops);
  // Group 0 in four rounds of two shards (one from each member), group 1 in two.
  ASSERT_EQ(ops.size(), 6u);
  std::vector<std::pair<uint32_t, uint32_t>> order;
  for (const auto& op : ops) order.push_back({op.round, op.group});
  EXPECT_EQ(order, (std::vector<std::pair<uint32_t, uint32_t>>{
                       {0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {3, 0}}));
  EXPECT_EQ(ops[0].items, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(ops[5].items, (std::vector<uint32_t>{6, 7}));
  // One round: one all-gather per group, whatever its size.
  ops = ScheduleGathers(p, {.rounds = 1});
  ExpectGathersCover(p, ops);
  EXPECT_EQ(ops.size(), 2u);
}

TEST(ScheduleGathersTest, RoundsSplitWhereAMemberSendsTooMuchOrSmallSlabsPileUp) {
  const BroadcastPlan p = EightAndTwo();
  // A member may send 15 bytes in one: group 0 needs a round per pair of shards.
  auto ops = ScheduleGathers(p, {.rounds = 1, .max_member_bytes = 15});
  ExpectGathersCover(p, ops);
  EXPECT_EQ(ops.size(), 4u + 1u);
  // Every shard is small (under 100 bytes) and a round may pack 25 of them: two per round.
  ops = ScheduleGathers(p, {.rounds = 1, .max_small_bytes = 25, .in_place_bytes = 100});
  ExpectGathersCover(p, ops);
  EXPECT_EQ(ops.size(), 4u + 1u);
  for (const auto& op : ops) EXPECT_EQ(op.small_bytes, BytesOf(p, op));
  // Large slabs are not packed: no limit applies.
  ops = ScheduleGathers(p, {.rounds = 1, .max_small_bytes = 25, .in_place_bytes = 10});
  EXPECT_EQ(ops.size(), 2u);
  for (const auto& op : ops) EXPECT_EQ(op.small_bytes, 0u);
}

}  // namespace
}  // namespace dcp::planner
