// Multi-rank save and load with ranks as threads (ThreadComm): the fast variant of the
// scenarios that mpi/save_mpi_test.cc runs as real processes.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "multirank_scenarios.h"
#include "test_util.h"

namespace dcp::testing {
namespace {

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

TEST(MultiRankThreads, OneRankFailingFailsEveryRank) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { OneRankFailsToWrite(c, tmp.path(), 2); });
}

TEST(MultiRankThreads, FileCoordinatorGivesTheSameCheckpoint) {
  TempDir tmp;
  RunRanks(4, [&](const auto& c) { FileCoordinatorMatches(c, tmp.path()); });
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
