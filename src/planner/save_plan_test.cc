#include "planner/save_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace dcp::planner {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

SaveItem TensorItem(const std::string& fqn, DType dtype, const Shape& global_shape,
                    const Box& box) {
  return SaveItem{fqn, false, dtype, global_shape, box, *DTypeBytes(dtype, box.NumElements())};
}

// A whole 1-d U8 tensor of `n` bytes.
SaveItem WholeU8(const std::string& fqn, uint64_t n) {
  const Shape shape{static_cast<int64_t>(n)};
  return TensorItem(fqn, DType::kU8, shape, Box::Whole(shape));
}

// Rows [row, row + rows) of a [total_rows, cols] F32 tensor.
SaveItem RowsF32(const std::string& fqn, int64_t total_rows, int64_t cols, int64_t row,
                 int64_t rows) {
  return TensorItem(fqn, DType::kF32, Shape{total_rows, cols},
                    Box{Shape{row, 0}, Shape{rows, cols}});
}

SaveItem BytesItem(const std::string& fqn, uint64_t n) {
  return SaveItem{fqn, true, DType::kU8, Shape(), Box(), n};
}

// One plan class per rank.
std::vector<std::vector<int>> OnePerRank(int world) {
  std::vector<std::vector<int>> h(world);
  for (int r = 0; r < world; ++r) h[r] = {r};
  return h;
}

GlobalSavePlan Plan(const std::vector<LocalSavePlan>& plans,
                    const std::vector<std::vector<int>>& holders, int world,
                    SavePlanOptions opts = {}) {
  auto r = PlanSave(plans, holders, world, opts);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : GlobalSavePlan();
}

int TensorWriter(const GlobalSavePlan& g, const std::string& fqn, size_t chunk = 0) {
  for (const auto& t : g.tensors) {
    if (t.fqn == fqn) return chunk < t.chunks.size() ? t.chunks[chunk].writer : -2;
  }
  return -3;
}

void ExpectSamePlan(const GlobalSavePlan& a, const GlobalSavePlan& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& ta = a.tensors[i];
    const auto& tb = b.tensors[i];
    EXPECT_EQ(ta.fqn, tb.fqn);
    EXPECT_EQ(ta.dtype, tb.dtype);
    EXPECT_EQ(ta.global_shape, tb.global_shape);
    ASSERT_EQ(ta.chunks.size(), tb.chunks.size()) << ta.fqn;
    for (size_t c = 0; c < ta.chunks.size(); ++c) {
      EXPECT_EQ(ta.chunks[c].box, tb.chunks[c].box) << ta.fqn;
      EXPECT_EQ(ta.chunks[c].nbytes, tb.chunks[c].nbytes) << ta.fqn;
      EXPECT_EQ(ta.chunks[c].writer, tb.chunks[c].writer)
          << ta.fqn << " " << ta.chunks[c].box.ToString();
    }
  }
  ASSERT_EQ(a.bytes.size(), b.bytes.size());
  for (size_t i = 0; i < a.bytes.size(); ++i) {
    EXPECT_EQ(a.bytes[i].fqn, b.bytes[i].fqn);
    EXPECT_EQ(a.bytes[i].nbytes, b.bytes[i].nbytes);
    EXPECT_EQ(a.bytes[i].writer, b.bytes[i].writer) << a.bytes[i].fqn;
  }
  EXPECT_EQ(a.bytes_per_rank, b.bytes_per_rank);
  EXPECT_EQ(a.unique_bytes, b.unique_bytes);
}

Status PlanStatus(const std::vector<LocalSavePlan>& plans, int world) {
  return PlanSave(plans, OnePerRank(world), world).status();
}

// ---------------------------------------------------------------------------------------
// PlanSave: dedup and balancing.

TEST(PlanSaveTest, DedupLeavesExactlyOneWriterPerChunk) {
  // Two ranks hold the same replicated "w" and each holds one half of "x".
  LocalSavePlan p0{{WholeU8("w", 64), RowsF32("x", 4, 2, 0, 2)}};
  LocalSavePlan p1{{RowsF32("x", 4, 2, 2, 2), WholeU8("w", 64)}};
  GlobalSavePlan g = Plan({p0, p1}, OnePerRank(2), 2);
  ASSERT_EQ(g.tensors.size(), 2u);
  EXPECT_EQ(g.tensors[0].fqn, "w");
  ASSERT_EQ(g.tensors[0].chunks.size(), 1u);
  EXPECT_EQ(g.tensors[0].chunks[0].nbytes, 64u);
  EXPECT_GE(g.tensors[0].chunks[0].writer, 0);
  EXPECT_LT(g.tensors[0].chunks[0].writer, 2);
  EXPECT_EQ(g.tensors[1].fqn, "x");
  ASSERT_EQ(g.tensors[1].chunks.size(), 2u);
  EXPECT_EQ(g.tensors[1].chunks[0].writer, 0);
  EXPECT_EQ(g.tensors[1].chunks[1].writer, 1);
  EXPECT_EQ(g.bytes_per_rank[0] + g.bytes_per_rank[1], 64u + 32u);
}

TEST(PlanSaveTest, FourEqualReplicatedTensorsGoToFourDifferentWriters) {
  LocalSavePlan p{{WholeU8("a", 1024), WholeU8("b", 1024), WholeU8("c", 1024), WholeU8("d", 1024)}};
  // As four plans (one per rank) and as one plan class held by all four ranks.
  for (bool one_class : {false, true}) {
    SCOPED_TRACE(one_class ? "one class" : "one plan per rank");
    GlobalSavePlan g =
        one_class ? Plan({p}, {{0, 1, 2, 3}}, 4) : Plan({p, p, p, p}, OnePerRank(4), 4);
    EXPECT_EQ(TensorWriter(g, "a"), 0);
    EXPECT_EQ(TensorWriter(g, "b"), 1);
    EXPECT_EQ(TensorWriter(g, "c"), 2);
    EXPECT_EQ(TensorWriter(g, "d"), 3);
    EXPECT_EQ(g.bytes_per_rank, (std::vector<uint64_t>{1024, 1024, 1024, 1024}));
  }
}

TEST(PlanSaveTest, LargeReplicatedChunksAreSplitAmongTheirHolders) {
  // A 64 MiB tensor and four 1 MiB ones, replicated on 4 ranks: whole-chunk balance would
  // leave one writer with 64 MiB; split along dimension 0 into pieces of at most an eighth
  // of a fair share (17 MiB / 8), each rank writes about 17 MiB.
  LocalSavePlan p{{RowsF32("big", 4096, 4096, 0, 4096), WholeU8("a", kMiB), WholeU8("b", kMiB),
                   WholeU8("c", kMiB), WholeU8("d", kMiB)}};
  GlobalSavePlan g = Plan({p, p, p, p}, OnePerRank(4), 4);
  const auto& big = *std::find_if(g.tensors.begin(), g.tensors.end(),
                                  [](const auto& t) { return t.fqn == "big"; });
  ASSERT_GE(big.chunks.size(), 30u);  // 64 MiB in pieces of at most 2.125 MiB
  int64_t row = 0;
  std::set<int> writers;
  for (const auto& c : big.chunks) {
    EXPECT_EQ(c.box.offsets[0], row);  // dimension-0 slices tiling the tensor
    EXPECT_EQ(c.box.lengths[1], 4096);
    EXPECT_LE(c.nbytes, 68 * kMiB / 4 / 8);
    row += c.box.lengths[0];
    writers.insert(c.writer);
  }
  EXPECT_EQ(row, 4096);
  EXPECT_EQ(writers.size(), 4u);
  EXPECT_EQ(g.unique_bytes, 68 * kMiB);
  auto [lo, hi] = std::minmax_element(g.bytes_per_rank.begin(), g.bytes_per_rank.end());
  EXPECT_LE(*hi - *lo, kMiB);
  // Chunks no larger than a piece (an eighth of a fair share, at least 256 KiB) stay whole.
  LocalSavePlan small{{WholeU8("a", 256 * 1024), WholeU8("b", 128 * 1024)}};
  GlobalSavePlan s = Plan({small, small}, OnePerRank(2), 2);
  EXPECT_EQ(s.tensors[0].chunks.size(), 1u);
}

TEST(PlanSaveTest, PiecesKeepWritersBalancedTileEveryChunkOnceAndIgnoreItemOrder) {
  // 16 ranks as tp2 x dp8 (classes {0,2,..}, {1,3,..}): row halves of some tensors per tp
  // class, whole tensors replicated on every rank; 1 KiB rows, up to 32 MiB per tensor.
  for (unsigned seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    LocalSavePlan even, odd;
    for (int t = 0; t < 40; ++t) {
      const std::string fqn = "t" + std::to_string(t);
      const int64_t rows = 2 + static_cast<int64_t>(rng() % 32768);
      if (rng() % 2) {
        even.items.push_back(RowsF32(fqn, 2 * rows, 256, 0, rows));
        odd.items.push_back(RowsF32(fqn, 2 * rows, 256, rows, rows));
      } else {
        even.items.push_back(RowsF32(fqn, rows, 256, 0, rows));
        odd.items.push_back(RowsF32(fqn, rows, 256, 0, rows));
      }
    }
    std::vector<std::vector<int>> holders(2);
    for (int r = 0; r < 16; ++r) holders[r % 2].push_back(r);
    GlobalSavePlan g = Plan({even, odd}, holders, 16);
    // Each tensor's pieces tile it exactly once (PlanSave checks overlaps; here the sum).
    uint64_t total = 0;
    for (const auto& t : g.tensors) {
      uint64_t elements = 0;
      for (const auto& c : t.chunks) {
        elements += c.box.NumElements();
        EXPECT_GE(c.writer, 0);
        total += c.nbytes;
      }
      EXPECT_EQ(elements, *t.global_shape.NumElements()) << t.fqn;
    }
    EXPECT_EQ(total, g.unique_bytes);
    const uint64_t max = *std::max_element(g.bytes_per_rank.begin(), g.bytes_per_rank.end());
    EXPECT_LE(static_cast<double>(max), 1.1 * static_cast<double>(g.unique_bytes) / 16);
    // The same plans with their items in another order.
    LocalSavePlan even2 = even, odd2 = odd;
    std::shuffle(even2.items.begin(), even2.items.end(), rng);
    std::shuffle(odd2.items.begin(), odd2.items.end(), rng);
    GlobalSavePlan h = Plan({even2, odd2}, holders, 16);
    ASSERT_EQ(g.tensors.size(), h.tensors.size());
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      ASSERT_EQ(g.tensors[i].chunks.size(), h.tensors[i].chunks.size());
      for (size_t k = 0; k < g.tensors[i].chunks.size(); ++k) {
        EXPECT_EQ(g.tensors[i].chunks[k].box, h.tensors[i].chunks[k].box);
        EXPECT_EQ(g.tensors[i].chunks[k].writer, h.tensors[i].chunks[k].writer);
      }
    }
    EXPECT_EQ(g.bytes_per_rank, h.bytes_per_rank);
  }
}

TEST(PlanSaveTest, LargestFirstToFewestBytesTiesToLowestRank) {
  // Three ranks all hold six replicated tensors; names put the big ones last in fqn order
  // so that processing in name order would give a different result.
  //   z8 (8 MiB) -> rank 0: loads 8,0,0
  //   y4 (4 MiB) -> rank 1: 8,4,0
  //   x2 (2 MiB) -> rank 2: 8,4,2
  //   a1 (1 MiB) -> rank 2: 8,4,3   (equal weights in fqn order: a1, b1, c1)
  //   b1 (1 MiB) -> rank 2: 8,4,4
  //   c1 (1 MiB) -> rank 1: 8,5,4   (tie between ranks 1 and 2 -> lowest)
  LocalSavePlan p{{WholeU8("a1", 1 * kMiB), WholeU8("b1", 1 * kMiB), WholeU8("c1", 1 * kMiB),
                   WholeU8("x2", 2 * kMiB), WholeU8("y4", 4 * kMiB), WholeU8("z8", 8 * kMiB)}};
  // Whole-chunk balance (z8 would otherwise be split: see the next test).
  GlobalSavePlan g = Plan({p, p, p}, OnePerRank(3), 3, {.split_replicas = false});
  EXPECT_EQ(TensorWriter(g, "z8"), 0);
  EXPECT_EQ(TensorWriter(g, "y4"), 1);
  EXPECT_EQ(TensorWriter(g, "x2"), 2);
  EXPECT_EQ(TensorWriter(g, "a1"), 2);
  EXPECT_EQ(TensorWriter(g, "b1"), 2);
  EXPECT_EQ(TensorWriter(g, "c1"), 1);
  EXPECT_EQ(g.bytes_per_rank, (std::vector<uint64_t>{8 * kMiB, 5 * kMiB, 4 * kMiB}));
  EXPECT_EQ(g.unique_bytes, 17 * kMiB);
}

TEST(PlanSaveTest, SingleHolderChunksAreCountedBeforeReplicatedOnes) {
  // Rank 0 alone holds "zz_private" (10 MiB), rank 1 alone holds "zz_small" (1 MiB); both
  // hold r1 and r2 (4 MiB each). The private chunks come last in name and item order, yet
  // they are counted first: r1 and r2 both go to rank 1 (1 -> 5 -> 9 < 10).
  LocalSavePlan p0{
      {WholeU8("r1", 4 * kMiB), WholeU8("r2", 4 * kMiB), WholeU8("zz_private", 10 * kMiB)}};
  LocalSavePlan p1{
      {WholeU8("r1", 4 * kMiB), WholeU8("r2", 4 * kMiB), WholeU8("zz_small", 1 * kMiB)}};
  GlobalSavePlan g = Plan({p0, p1}, OnePerRank(2), 2);
  EXPECT_EQ(TensorWriter(g, "zz_private"), 0);
  EXPECT_EQ(TensorWriter(g, "zz_small"), 1);
  EXPECT_EQ(TensorWriter(g, "r1"), 1);
  EXPECT_EQ(TensorWriter(g, "r2"), 1);
  EXPECT_EQ(g.bytes_per_rank, (std::vector<uint64_t>{10 * kMiB, 9 * kMiB}));
}

TEST(PlanSaveTest, ChunkOfOneClassWithSeveralRanksIsBalancedAmongThem) {
  // One class held by ranks {1, 2}; rank 0 holds a private chunk. Two replicated chunks
  // spread over ranks 1 and 2; none goes to rank 0, which does not hold them.
  LocalSavePlan a{{WholeU8("p", 100)}};
  LocalSavePlan b{{WholeU8("r1", 10), WholeU8("r2", 10)}};
  GlobalSavePlan g = Plan({a, b}, {{0}, {1, 2}}, 3);
  EXPECT_EQ(TensorWriter(g, "p"), 0);
  EXPECT_EQ(TensorWriter(g, "r1"), 1);
  EXPECT_EQ(TensorWriter(g, "r2"), 2);
}

// A TP x DP-like workload: `tp` column shards of several tensors; tp rank t holds shard t.
LocalSavePlan TpShardPlan(int tp, int t) {
  LocalSavePlan p;
  const int64_t sizes[] = {64, 32, 32, 16, 8, 8, 4};
  for (int i = 0; i < 7; ++i) {
    const Shape shape{sizes[i], 8 * tp};
    p.items.push_back(TensorItem("layer" + std::to_string(i), DType::kBF16, shape,
                                 Box{Shape{0, 8 * t}, Shape{sizes[i], 8}}));
  }
  p.items.push_back(BytesItem("extra", 5));
  return p;
}

TEST(PlanSaveTest, PlanClassesGiveTheSameWritersAsOnePlanPerRank) {
  // 8 ranks, TP2 x DP4: ranks {0,2,4,6} share plan A (shard 0), {1,3,5,7} plan B (shard 1).
  const LocalSavePlan a = TpShardPlan(2, 0);
  const LocalSavePlan b = TpShardPlan(2, 1);
  GlobalSavePlan by_class = Plan({a, b}, {{0, 2, 4, 6}, {1, 3, 5, 7}}, 8);
  std::vector<LocalSavePlan> per_rank;
  for (int r = 0; r < 8; ++r) per_rank.push_back(r % 2 == 0 ? a : b);
  GlobalSavePlan by_rank = Plan(per_rank, OnePerRank(8), 8);
  ExpectSamePlan(by_class, by_rank);
  // Every shard is written by a rank that holds it.
  for (const auto& t : by_class.tensors) {
    ASSERT_EQ(t.chunks.size(), 2u);
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(t.chunks[s].writer % 2, s) << t.fqn;
    }
  }
}

TEST(PlanSaveTest, ResultDoesNotDependOnItemOrderOrClassOrder) {
  const int world = 12;
  std::mt19937 rng(1234);
  // Six plan classes of two ranks each (rank r and r + 6), with overlapping replication:
  // class c holds shard c % 3 of every tensor plus a few tensors replicated everywhere.
  std::vector<LocalSavePlan> plans(6);
  std::vector<std::vector<int>> holders(6);
  for (int c = 0; c < 6; ++c) {
    holders[c] = {c, c + 6};
    for (int i = 0; i < 10; ++i) {
      const int64_t rows = 3 + i;
      plans[c].items.push_back(
          RowsF32("sharded" + std::to_string(i), 3 * rows, 4, (c % 3) * rows, rows));
      plans[c].items.push_back(WholeU8("rep" + std::to_string(i), 100 + 7 * i));
    }
    plans[c].items.push_back(BytesItem("b" + std::to_string(c % 2), 3));
    plans[c].items.push_back(BytesItem("common", 3));
  }
  const GlobalSavePlan reference = Plan(plans, holders, world);

  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::vector<int> perm(plans.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<LocalSavePlan> p2;
    std::vector<std::vector<int>> h2;
    for (int i : perm) {
      p2.push_back(plans[i]);
      std::shuffle(p2.back().items.begin(), p2.back().items.end(), rng);
      h2.push_back(holders[i]);
    }
    ExpectSamePlan(Plan(p2, h2, world), reference);
  }
}

TEST(PlanSaveTest, NoBalanceGivesLowestRankedHolder) {
  // Classes: {3}, {1, 2}, {0}. "w" is held by {3} and {1, 2}; "v" by everyone.
  LocalSavePlan a{{WholeU8("w", 10), WholeU8("v", 10)}};
  LocalSavePlan b{{WholeU8("v", 10), WholeU8("w", 10), BytesItem("extra", 4)}};
  LocalSavePlan c{{WholeU8("v", 10), BytesItem("extra", 4)}};
  GlobalSavePlan g = Plan({a, b, c}, {{3}, {1, 2}, {0}}, 4, SavePlanOptions{.balance = false});
  EXPECT_EQ(TensorWriter(g, "w"), 1);
  EXPECT_EQ(TensorWriter(g, "v"), 0);
  ASSERT_EQ(g.bytes.size(), 1u);
  EXPECT_EQ(g.bytes[0].writer, 0);
  EXPECT_EQ(g.bytes_per_rank, (std::vector<uint64_t>{11, 10, 0, 0}));
}

TEST(PlanSaveTest, RandomReplicatedWorkloadHeaviestWithinLargestChunkOfLightest) {
  const uint32_t seed = 20240611;
  std::cout << "[ seed ] " << seed << "\n";
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const DType dtypes[] = {DType::kU8, DType::kBF16, DType::kF32, DType::kF64};
  for (int trial = 0; trial < 50; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const int world = std::uniform_int_distribution<int>(2, 16)(rng);
    LocalSavePlan plan;
    uint64_t largest = 0;
    const int num_tensors = std::uniform_int_distribution<int>(1, 30)(rng);
    for (int i = 0; i < num_tensors; ++i) {
      const DType dt = dtypes[rng() % 4];
      const int64_t rows = std::uniform_int_distribution<int64_t>(1, 200)(rng);
      const int64_t cols = std::uniform_int_distribution<int64_t>(1, 50)(rng);
      // Split the rows into a random number of chunks (all replicated on every rank).
      const int64_t parts =
          std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(rows, 5))(rng);
      int64_t row = 0;
      for (int64_t k = 0; k < parts; ++k) {
        const int64_t len =
            k + 1 == parts ? rows - row : std::max<int64_t>(1, (rows - row) / (parts - k));
        SaveItem it = TensorItem("t" + std::to_string(i), dt, Shape{rows, cols},
                                 Box{Shape{row, 0}, Shape{len, cols}});
        largest = std::max(largest, it.nbytes);
        plan.items.push_back(it);
        row += len;
      }
    }
    for (int i = 0; i < 3; ++i) plan.items.push_back(BytesItem("obj" + std::to_string(i), 1000));
    largest = std::max<uint64_t>(largest, 1);
    // A random partition of the ranks into classes, all with the same plan.
    std::vector<int> ranks(world);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::shuffle(ranks.begin(), ranks.end(), rng);
    std::vector<std::vector<int>> holders;
    for (int r : ranks) {
      if (holders.empty() || rng() % 3 == 0) holders.emplace_back();
      holders.back().push_back(r);
    }
    for (auto& h : holders) std::sort(h.begin(), h.end());
    std::vector<LocalSavePlan> plans(holders.size(), plan);
    GlobalSavePlan g = Plan(plans, holders, world);
    const auto [lo, hi] = std::minmax_element(g.bytes_per_rank.begin(), g.bytes_per_rank.end());
    EXPECT_LE(*hi, *lo + largest) << "world " << world;
    // The same plan given as one class per rank balances identically.
    std::vector<LocalSavePlan> per_rank(world, plan);
    ExpectSamePlan(Plan(per_rank, OnePerRank(world), world), g);
  }
}

// ---------------------------------------------------------------------------------------
// PlanSave: errors.

TEST(PlanSaveTest, DtypeDisagreementNamesFqnAndRanks) {
  const Shape s{4};
  LocalSavePlan p0{{TensorItem("w", DType::kF32, s, Box::Whole(s))}};
  LocalSavePlan p1{{TensorItem("w", DType::kF16, s, Box::Whole(s))}};
  Status st = PlanStatus({p0, p1}, 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("F16"), std::string::npos) << st.message();
}

TEST(PlanSaveTest, GlobalShapeDisagreementNamesFqnAndRanks) {
  LocalSavePlan p0{{RowsF32("w", 4, 2, 0, 2)}};
  LocalSavePlan p1{{RowsF32("w", 4, 3, 2, 2)}};
  LocalSavePlan p2{{RowsF32("w", 4, 2, 2, 2)}};
  // Classes in rank order {0}, {1, 2}: the message names the first holder of each class.
  Status st = PlanSave({p0, p1}, {{0}, {1, 2}}, 3).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[4, 3]"), std::string::npos) << st.message();
  EXPECT_TRUE(PlanStatus({p0, p2}, 2).ok());
}

TEST(PlanSaveTest, TensorVersusBytesDisagreementNamesFqnAndRanksEitherWay) {
  LocalSavePlan tensor{{WholeU8("w", 4)}};
  LocalSavePlan bytes{{BytesItem("w", 4)}};
  for (bool tensor_first : {true, false}) {
    Status st = tensor_first ? PlanStatus({tensor, bytes}, 2) : PlanStatus({bytes, tensor}, 2);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("'w'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(tensor_first ? "tensor on rank 0" : "tensor on rank 1"),
              std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find(tensor_first ? "bytes on rank 1" : "bytes on rank 0"),
              std::string::npos)
        << st.message();
  }
}

TEST(PlanSaveTest, OverlappingNonIdenticalChunksNameFqnAndRanks) {
  LocalSavePlan p0{{RowsF32("w", 4, 2, 0, 3)}};
  LocalSavePlan p1{{RowsF32("w", 4, 2, 2, 2)}};
  Status st = PlanStatus({p0, p1}, 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
}

TEST(PlanSaveTest, ChunksNotCoveringTheTensorAreRejected) {
  LocalSavePlan p0{{RowsF32("w", 6, 2, 0, 2)}};
  LocalSavePlan p1{{RowsF32("w", 6, 2, 4, 2)}};
  Status st = PlanStatus({p0, p1}, 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cover 8 of its 12"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------------------------------
// PlanSave: bytes entries and accounting.

TEST(PlanSaveTest, BytesEntriesWeighOneAndDedupByFqn) {
  // Huge bytes payloads still weigh 1: the two replicated entries alternate ranks, and a
  // 3-byte tensor on rank 0 outweighs both.
  LocalSavePlan p0{{BytesItem("a", 1000000), BytesItem("b", 1000000), WholeU8("t", 3)}};
  LocalSavePlan p1{{BytesItem("b", 1000000), BytesItem("a", 1000000)}};
  GlobalSavePlan g = Plan({p0, p1}, OnePerRank(2), 2);
  ASSERT_EQ(g.bytes.size(), 2u);
  EXPECT_EQ(g.bytes[0].fqn, "a");
  EXPECT_EQ(g.bytes[1].fqn, "b");
  EXPECT_EQ(g.bytes[0].nbytes, 1000000u);
  EXPECT_EQ(g.bytes[0].writer, 1);
  EXPECT_EQ(g.bytes[1].writer, 1);
  EXPECT_EQ(g.bytes_per_rank, (std::vector<uint64_t>{3, 2}));
}

TEST(PlanSaveTest, UniqueBytesCountsEachChunkOnce) {
  // 4 ranks: "rep" (1 KiB) everywhere, "x" split into 4 row chunks of 2 x 8 F32 (64 bytes).
  std::vector<LocalSavePlan> plans(4);
  for (int r = 0; r < 4; ++r) {
    plans[r].items = {WholeU8("rep", 1024), RowsF32("x", 8, 8, 2 * r, 2)};
  }
  GlobalSavePlan g = Plan(plans, OnePerRank(4), 4);
  EXPECT_EQ(g.unique_bytes, 1024u + 4 * 64u);
  uint64_t total = 0;
  for (uint64_t b : g.bytes_per_rank) total += b;
  EXPECT_EQ(total, g.unique_bytes);
}

// ---------------------------------------------------------------------------------------
// BuildLocalSavePlan.

TEST(BuildLocalSavePlanTest, ListsTensorChunksAndBytesInStateDictOrder) {
  std::vector<float> a(6), b(4);
  StateDict sd;
  sd.add("w", TensorView(a.data(), DType::kF32, Shape{3, 2}), Chunk{Shape{6, 2}, Shape{3, 0}});
  sd.add_bytes("extra", std::string_view("hello"));
  sd.add("v", TensorView(b.data(), DType::kF32, Shape{4}));
  auto r = BuildLocalSavePlan(sd);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->items.size(), 3u);
  EXPECT_EQ(r->items[0], TensorItem("w", DType::kF32, Shape{6, 2}, Box{Shape{3, 0}, Shape{3, 2}}));
  EXPECT_EQ(r->items[1], BytesItem("extra", 5));
  EXPECT_EQ(r->items[2], TensorItem("v", DType::kF32, Shape{4}, Box::Whole(Shape{4})));
}

TEST(BuildLocalSavePlanTest, RejectsSubByteChunkNotEndingOnWholeByte) {
  uint8_t mem[4] = {};
  StateDict sd;
  // 3 F4 elements are 12 bits.
  sd.add("w", TensorView(mem, DType::kF4, Shape{3}), Chunk{Shape{8}, Shape{0}});
  auto r = BuildLocalSavePlan(sd);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("whole byte"), std::string::npos) << r.status().message();

  StateDict ok;
  ok.add("w", TensorView(mem, DType::kF4, Shape{4}), Chunk{Shape{8}, Shape{4}});
  auto r2 = BuildLocalSavePlan(ok);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->items[0].nbytes, 2u);
}

TEST(BuildLocalSavePlanTest, RejectsChunkOutsideGlobalShape) {
  float mem[4] = {};
  StateDict sd;
  sd.add("w", TensorView(mem, DType::kF32, Shape{2, 2}), Chunk{Shape{4, 2}, Shape{3, 0}});
  auto r = BuildLocalSavePlan(sd);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("global shape"), std::string::npos) << r.status().message();

  StateDict wrong_rank;
  wrong_rank.add("w", TensorView(mem, DType::kF32, Shape{4}), Chunk{Shape{4, 2}, Shape{0}});
  EXPECT_EQ(BuildLocalSavePlan(wrong_rank).status().code(), StatusCode::kInvalidArgument);
}

TEST(BuildLocalSavePlanTest, RejectsMixedDtypesInOneFqn) {
  float a[2] = {};
  uint16_t b[2] = {};
  StateDict sd;
  sd.add("w", TensorView(a, DType::kF32, Shape{2}), Chunk{Shape{4}, Shape{0}});
  sd.add("w", TensorView(b, DType::kF16, Shape{2}), Chunk{Shape{4}, Shape{2}});
  auto r = BuildLocalSavePlan(sd);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("different dtypes"), std::string::npos)
      << r.status().message();
}

TEST(BuildLocalSavePlanTest, RejectsNonEmptyBoxAddedTwice) {
  float a[2] = {}, b[2] = {};
  StateDict sd;
  sd.add("w", TensorView(a, DType::kF32, Shape{2}), Chunk{Shape{4}, Shape{2}});
  sd.add("w", TensorView(b, DType::kF32, Shape{2}), Chunk{Shape{4}, Shape{2}});
  auto r = BuildLocalSavePlan(sd);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("added twice"), std::string::npos) << r.status().message();
}

TEST(BuildLocalSavePlanTest, AcceptsRepeatedEmptyBoxesAndKeepsOne) {
  // torch.chunk-style uneven split of 6 rows into 4: [0,2) [2,4) [4,6) and an empty tail,
  // which a rank holding several pieces may add more than once.
  float a[4] = {};
  StateDict sd;
  sd.add("w", TensorView(a, DType::kF32, Shape{2, 2}), Chunk{Shape{6, 2}, Shape{0, 0}});
  sd.add("w", TensorView(nullptr, DType::kF32, Shape{0, 2}), Chunk{Shape{6, 2}, Shape{6, 0}});
  sd.add("w", TensorView(nullptr, DType::kF32, Shape{0, 2}), Chunk{Shape{6, 2}, Shape{6, 0}});
  auto r = BuildLocalSavePlan(sd);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->items.size(), 2u);
  EXPECT_EQ(r->items[0].nbytes, 16u);
  EXPECT_EQ(r->items[1].box, (Box{Shape{6, 0}, Shape{0, 2}}));
  EXPECT_EQ(r->items[1].nbytes, 0u);
}

// ---------------------------------------------------------------------------------------
// EncodeLocalPlan / DecodeLocalPlan.

LocalSavePlan MixedPlan() {
  LocalSavePlan p;
  p.items.push_back(RowsF32("model.layers.0.weight", 8192, 2048, 4096, 4096));
  p.items.push_back(BytesItem("optimizer.state", 12345));
  p.items.push_back(TensorItem("scalar", DType::kF64, Shape(), Box::Whole(Shape())));
  p.items.push_back(TensorItem("packed", DType::kF4, Shape{4, 6}, Box{Shape{2, 0}, Shape{2, 6}}));
  p.items.push_back(TensorItem("empty", DType::kBF16, Shape{5, 3}, Box{Shape{5, 0}, Shape{0, 3}}));
  p.items.push_back(BytesItem("", 0));
  return p;
}

TEST(EncodeLocalPlanTest, RoundTrips) {
  const LocalSavePlan p = MixedPlan();
  auto r = DecodeLocalPlan(EncodeLocalPlan(p));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->items, p.items);

  auto empty = DecodeLocalPlan(EncodeLocalPlan(LocalSavePlan{}));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->items.empty());
}

TEST(EncodeLocalPlanTest, DecodeOfGarbageIsAnError) {
  const std::string good = EncodeLocalPlan(MixedPlan());
  EXPECT_FALSE(DecodeLocalPlan("").ok());
  EXPECT_FALSE(DecodeLocalPlan(std::string(32, '\xff')).ok());
  EXPECT_FALSE(DecodeLocalPlan("garbage that is not a plan").ok());
  EXPECT_FALSE(DecodeLocalPlan(good + "x").ok());  // trailing bytes
  for (size_t n = 0; n < good.size(); ++n) {
    auto r = DecodeLocalPlan(std::string_view(good).substr(0, n));
    EXPECT_FALSE(r.ok()) << "truncated to " << n;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    }
  }
  // A bad dtype byte: one tensor item whose dtype is out of range.
  LocalSavePlan one{{WholeU8("w", 4)}};
  std::string enc = EncodeLocalPlan(one);
  // Layout: count, fqn len, 'w', is_bytes, nbytes, path len (0), dtype, ...
  ASSERT_EQ(enc[6], static_cast<char>(DType::kU8));
  enc[6] = static_cast<char>(kNumDTypes);
  auto bad = DecodeLocalPlan(enc);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dcp::planner
