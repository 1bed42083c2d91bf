// Multi-rank save and load with ranks as threads (ThreadComm): the fast variant of the
// scenarios that mpi/save_mpi_test.cc runs as real processes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <thread>

#include "checkpoint/save.h"
#include "dcp/checkpoint.h"
#include "multirank_scenarios.h"
#include "simulate/simulate.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"
#include "workload/populate.h"
#include "workload/workload.h"

namespace dcp::testing {
namespace {

// The simulator's exchange figures are predictions; a real save measures what it received.
// Two independent computations of the same number: they must agree.
TEST(MultiRankThreads, SimulatePredictsTheExchangeOfARealSave) {
  TempDir tmp;
  checkpoint::ClearSavePlanCache();
  simulate::SimulateOptions so;
  so.workload = {
      .model = "qwen3-30b-a3b", .layers = 2, .width_scale = 1.0 / 32, .save_layout = "tp2,dp2"};
  so.ranks = 4;
  so.ranks_per_host = 4;
  auto report = simulate::Simulate(so);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  auto w = workload::MakeWorkload(so.workload, "dp4");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<uint64_t> miss(4), hit(4);
  RunRanks(4, [&](const auto& c) {
    auto sd = workload::PopulateStateDict(w->model, w->save_layout, c->rank());
    ASSERT_TRUE(sd.ok()) << sd.status().ToString();
    miss[c->rank()] = save(sd->sd, tmp.Sub("a"), {.comm = c}).plan_exchange_bytes;
    hit[c->rank()] = save(sd->sd, tmp.Sub("b"), {.comm = c}).plan_exchange_bytes;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(miss[r], report->exchange_bytes_per_rank) << "rank " << r;
    EXPECT_EQ(hit[r], report->hello_bytes_per_rank) << "rank " << r;  // a hit: hashes only
  }
  EXPECT_LT(hit[0], miss[0]);
}

std::string BytesOf(const StateDict& sd, std::string_view fqn) {
  const auto& b = sd.find(fqn)->bytes;
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// A value that differs between ranks under one name (a data loader's position per rank) is
// kept per rank: loaded by as many ranks, each gets its own back; by another number of ranks,
// every rank gets the lowest saving rank's, with a warning naming it. The saves that differ
// take the plan cached by the equal one (same names and sizes): the check runs on a
// plan-cache hit too, twice in a row. On a hit, values under per-rank names cost nothing:
// the exchange is the hashes alone.
TEST(MultiRankThreads, ValuesThatDifferBetweenRanksAreKeptPerRank) {
  TempDir tmp;
  std::vector<std::string> loaded(3), warnings(3);
  std::vector<int> cached(3);  // not vector<bool>: ranks write at once
  std::vector<uint64_t> exchanged(3);
  RunRanks(3, [&](const auto& c) {
    const int r = c->rank();
    std::vector<float> w(4, 1.0f);
    auto state = [&](std::string_view seed) {
      StateDict sd;
      sd.add("w", TensorView(w.data(), DType::kF32, {4}));
      sd.add_bytes("step", std::string_view("100"));
      sd.add_bytes("rng." + std::to_string(r), std::string_view(r == 0 ? "a" : "b"));
      sd.add_bytes("seed", seed);
      return sd;
    };
    ASSERT_NO_THROW(save(state("7"), tmp.Sub("equal"), {.comm = c}));
    const StateDict differ = state(r == 1 ? "8" : "7");
    ASSERT_NO_THROW(save(differ, tmp.Sub("differ"), {.comm = c}));
    ASSERT_NO_THROW(save(differ, tmp.Sub("differ"), {.comm = c}));
    const SaveResult again = save(state("7"), tmp.Sub("again"), {.comm = c});
    cached[r] = again.plan_cache_hit;
    exchanged[r] = again.plan_exchange_bytes;
    StateDict back;
    back.add("w", TensorView(w.data(), DType::kF32, {4}));
    back.add_bytes("seed");
    back.add_bytes("step");
    const LoadResult lr = load(back, tmp.Sub("differ"), {.comm = c});
    loaded[r] = BytesOf(back, "seed") + "/" + BytesOf(back, "step");
    for (const auto& line : lr.warnings) warnings[r] += line;
  });
  EXPECT_EQ(loaded, (std::vector<std::string>{"7/100", "8/100", "7/100"}));
  EXPECT_EQ(warnings, std::vector<std::string>(3));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(cached[r]) << "rank " << r;  // the plan stayed cached
    EXPECT_EQ(exchanged[r], 3 * checkpoint::kSaveHelloBytes) << "rank " << r;
  }
  const Metadata md = read_metadata(tmp.Sub("differ"));
  std::vector<std::string> names;
  for (const auto& b : md.bytes) names.push_back(b.fqn);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"rng.0", "rng.1", "rng.2", "seed.__dcp_rank_0",
                                             "seed.__dcp_rank_1", "seed.__dcp_rank_2", "step"}));
  // Another number of ranks: rank 0's value, said on every rank.
  RunRanks(2, [&](const auto& c) {
    StateDict back;
    back.add_bytes("seed");
    const LoadResult lr = load(back, tmp.Sub("differ"), {.comm = c, .allow_partial = true});
    loaded[c->rank()] = BytesOf(back, "seed");
    ASSERT_EQ(lr.warnings.size(), 1u);
    warnings[c->rank()] = lr.warnings[0];
  });
  EXPECT_EQ(loaded[0], "7");
  EXPECT_EQ(loaded[1], "7");
  EXPECT_NE(warnings[1].find("'seed' was saved per rank"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[1].find("loads rank 0's value"), std::string::npos) << warnings[1];
}

// A name one rank held alone when the others cached their plan is now held by another rank
// too, with other bytes: the ranks whose plans are unchanged send hashes of the cached plan's
// shared names only (equal), the changed rank plans anew; the difference is still found, and
// both values kept.
TEST(MultiRankThreads, AValueANewPlanSharesIsCheckedOnRanksThatKeptTheirPlan) {
  TempDir tmp;
  std::vector<std::string> loaded(3);
  RunRanks(3, [&](const auto& c) {
    const int r = c->rank();
    std::vector<float> w(4, 1.0f);
    StateDict sd;
    sd.add("w", TensorView(w.data(), DType::kF32, {4}));
    sd.add_bytes("step", std::string_view("100"));
    sd.add_bytes("rng." + std::to_string(r), std::string_view(r == 1 ? "one" : "other"));
    ASSERT_NO_THROW(save(sd, tmp.Sub("first"), {.comm = c}));
    if (r == 2) sd.add_bytes("rng.1", std::string_view("two"));  // the same size as "one"
    ASSERT_NO_THROW(save(sd, tmp.Sub("second"), {.comm = c}));
    StateDict back;
    back.add_bytes("rng.1");
    load(back, tmp.Sub("second"), {.comm = c, .allow_partial = true});
    loaded[r] = BytesOf(back, "rng.1");
  });
  // Ranks 1 and 2 get their own; rank 0 saved none: the lowest saving rank's.
  EXPECT_EQ(loaded, (std::vector<std::string>{"one", "one", "two"}));
}

TEST(MultiRankThreads, TensorParallelTimesDataParallel) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) {
    SaveThenReshard(c, tmp.path(), "tp2,dp2", {"tp4", "tp2", "ep4"});
  });
}

TEST(MultiRankThreads, PureDataParallel) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { SaveThenReshard(c, tmp.path(), "dp4", {"tp4", "dp2"}); });
}

TEST(MultiRankThreads, ExpertParallel) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { SaveThenReshard(c, tmp.path(), "ep4", {"tp2,dp2", "ep2"}); });
}

TEST(MultiRankThreads, DataParallelTimesTensorParallelToThreeRanks) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { SaveThenReshard(c, tmp.path(), "dp2,tp2", {"tp3", "dp3"}); });
}

TEST(MultiRankThreads, UnevenShardsWithEmptyTail) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { SaveUnevenTensors(c, tmp.path()); });
}

TEST(MultiRankThreads, IncrementalSavesWriteOnlyWhatChanged) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { IncrementalSaves(c, tmp.path(), "tp2,dp2", "tp4"); });
}

TEST(MultiRankThreads, OneRankFailingFailsEveryRank) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { OneRankFailsToWrite(c, tmp.path(), 2); });
}

TEST(MultiRankThreads, FileCoordinatorGivesTheSameCheckpoint) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { FileCoordinatorMatches(c, tmp.path()); });
}

TEST(MultiRankThreads, RanksSeeDifferentDirectories) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { RanksSeeDifferentDirectories(c, tmp.path()); });
}

TEST(MultiRankThreads, WithoutCollectives) {
  TempDir tmp;
  RunRanks(3, [&](const auto& c) { SaveWithoutCollectives(c, tmp.path()); });
}

}  // namespace
}  // namespace dcp::testing

namespace dcp::testing {
namespace {

TEST(MultiRankThreads, AsyncSaveWhileTraining) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { AsyncSaveWhileTraining(c, tmp.path()); });
}

TEST(MultiRankThreads, AsyncSaveOneRankFailingFailsEveryHandle) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { AsyncSaveOneRankFails(c, tmp.path(), 2); });
}

TEST(MultiRankThreads, AsyncSaveThroughFileCoordinator) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { AsyncSaveThroughFileCoordinator(c, tmp.path()); });
}

}  // namespace
}  // namespace dcp::testing

namespace dcp::testing {
namespace {

TEST(BroadcastThreads, PureDataParallelReadsEachByteOnce) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { BroadcastLoad(c, tmp.path(), "dp4", "dp4"); });
}

TEST(BroadcastThreads, ReshardingLayouts) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) {
    BroadcastLoad(c, tmp.path(), "tp4", "tp2,dp2");
    BroadcastLoad(c, tmp.path(), "tp2,dp2", "tp4");
    BroadcastLoad(c, tmp.path(), "dp2,tp2", "tp2,dp2");
    BroadcastLoad(c, tmp.path(), "ep4", "ep2,dp2");
  });
}

TEST(BroadcastThreads, InterleavedGroups) {
  TempDir tmp;
  // dp2,tp2: tensor-parallel piece 0 on ranks 0 and 2, piece 1 on ranks 1 and 3.
  RunRanks(4, [&](const auto& c) { BroadcastLoad(c, tmp.path(), "dp2,tp2", "dp2,tp2"); });
}

TEST(BroadcastThreads, ManyInFlight) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { BroadcastManyInFlight(c, tmp.path()); });
}

TEST(BroadcastThreads, LargeShardsSplitIntoSlabs) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { BroadcastSlabs(c, tmp.path()); });
}

TEST(BroadcastThreads, CorruptShardFailsEveryRank) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { BroadcastReadFailure(c, tmp.path()); });
}

TEST(BroadcastThreads, EightRanks) {
  TempDir tmp;
  RunRanks(8, [&](const auto& c) { BroadcastLoad(c, tmp.path(), "tp2,dp4", "tp4,dp2"); });
}

}  // namespace
}  // namespace dcp::testing

namespace dcp::testing {
namespace {

TEST(HuggingFaceThreads, DirectTensorParallelLoadReadsEachByteOnce) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { HuggingFaceDirectLoad(c, tmp.path()); });
}

}  // namespace
}  // namespace dcp::testing

namespace dcp::testing {
namespace {

// Saving without collectives over a checkpoint saved with them: if rank 0 fails (so the old
// global metadata stays), the other ranks must not have deleted the files it names.
TEST(MultiRankThreads, IndependentSaveKeepsFilesTheGlobalMetadataNames) {
  TempDir tmp;
  std::vector<float> a(64), b(64);
  for (int i = 0; i < 64; ++i) a[i] = static_cast<float>(i);
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    StateDict sd;
    float* mine = c->rank() == 0 ? a.data() : a.data() + 32;
    sd.add("w", TensorView(mine, DType::kF32, {32}), Chunk{{64}, {32 * c->rank()}});
    ASSERT_NO_THROW(save(sd, tmp.path(), {.comm = c}));
    ASSERT_TRUE(c->Barrier().ok());
    testfs::FaultFileSystem fs(storage::PosixFileSystem());
    if (c->rank() == 0) fs.FailAt(0);
    auto r = checkpoint::Save(sd, tmp.path(), {.comm = c, .use_collectives = false}, fs);
    EXPECT_EQ(r.ok(), c->rank() == 1) << r.status().ToString();
  });
  StateDict whole;
  whole.add("w", TensorView(b.data(), DType::kF32, {64}));
  ASSERT_NO_THROW(load(whole, tmp.path()));
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace dcp::testing
