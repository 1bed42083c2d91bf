// The multi-rank scenarios with real processes: run under `mpirun -np 4`.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "dcp/mpi_comm.h"
#include "multirank_scenarios.h"

namespace dcp::testing {
namespace {

std::shared_ptr<Comm> World() {
  static std::shared_ptr<Comm> world = [] {
    auto c = MpiComm(MPI_COMM_WORLD);
    c->set_timeout(std::chrono::seconds(300));
    return c;
  }();
  return world;
}

// A directory every rank shares: made by rank 0, its name broadcast.
class SharedDir {
 public:
  SharedDir() {
    if (World()->rank() == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "dcp-mpi-test-XXXXXX").string();
      path_ = mkdtemp(tmpl.data()) ? tmpl : "";
    }
    EXPECT_TRUE(World()->Broadcast(path_, 0).ok());
  }
  ~SharedDir() {
    (void)World()->Barrier();
    if (World()->rank() == 0) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(MultiRankMpi, TensorParallelTimesDataParallel) {
  SharedDir d;
  SaveThenReshard(World(), d.path(), "tp2,dp2", {"tp4", "tp2", "ep4"});
}

TEST(MultiRankMpi, PureDataParallel) {
  SharedDir d;
  SaveThenReshard(World(), d.path(), "dp4", {"tp4", "dp2", "tp3"});
}

TEST(MultiRankMpi, ExpertParallel) {
  SharedDir d;
  SaveThenReshard(World(), d.path(), "ep4", {"tp2,dp2", "ep2"});
}

TEST(MultiRankMpi, IncrementalSavesWriteOnlyWhatChanged) {
  SharedDir d;
  IncrementalSaves(World(), d.path(), "tp2,dp2", "ep4");
}

TEST(MultiRankMpi, UnevenShardsWithEmptyTail) {
  SharedDir d;
  SaveUnevenTensors(World(), d.path());
}

TEST(MultiRankMpi, OneRankFailingFailsEveryRank) {
  SharedDir d;
  OneRankFailsToWrite(World(), d.path(), 2);
}

TEST(MultiRankMpi, FileCoordinatorGivesTheSameCheckpoint) {
  SharedDir d;
  FileCoordinatorMatches(World(), d.path());
}

TEST(MultiRankMpi, RanksSeeDifferentDirectories) {
  SharedDir d;
  RanksSeeDifferentDirectories(World(), d.path());
}

TEST(MultiRankMpi, WithoutCollectives) {
  SharedDir d;
  SaveWithoutCollectives(World(), d.path());
}

}  // namespace
}  // namespace dcp::testing

namespace dcp::testing {
namespace {

// The saver's collectives run on a background thread over its own communicator while the
// test's main thread runs collectives on the world: needs MPI_THREAD_MULTIPLE.
TEST(MultiRankMpi, AsyncSaveWhileTraining) {
  SharedDir d;
  AsyncSaveWhileTraining(World(), d.path());
}

TEST(MultiRankMpi, AsyncSaveOneRankFailingFailsEveryHandle) {
  SharedDir d;
  AsyncSaveOneRankFails(World(), d.path(), 2);
}

TEST(MultiRankMpi, AsyncSaveThroughFileCoordinator) {
  SharedDir d;
  AsyncSaveThroughFileCoordinator(World(), d.path());
}

// Read-once broadcast with real processes (4 ranks unless said otherwise).
TEST(BroadcastMpi, PureDataParallelReadsEachByteOnce) {
  if (World()->size() != 4) FAIL() << "needs 4 ranks (ctest runs it with mpirun -np 4)";
  SharedDir d;
  BroadcastLoad(World(), d.path(), "dp4", "dp4");
}

TEST(BroadcastMpi, ReshardingLayouts) {
  if (World()->size() != 4) FAIL() << "needs 4 ranks (ctest runs it with mpirun -np 4)";
  SharedDir d;
  BroadcastLoad(World(), d.path(), "tp4", "tp2,dp2");
  BroadcastLoad(World(), d.path(), "tp2,dp2", "tp4");
  BroadcastLoad(World(), d.path(), "dp2,tp2", "tp2,dp2");
  BroadcastLoad(World(), d.path(), "ep4", "ep2,dp2");
}

TEST(BroadcastMpi, InterleavedGroups) {
  if (World()->size() != 4) FAIL() << "needs 4 ranks (ctest runs it with mpirun -np 4)";
  SharedDir d;
  BroadcastLoad(World(), d.path(), "dp2,tp2", "dp2,tp2");
}

TEST(BroadcastMpi, ManyInFlight) {
  SharedDir d;
  BroadcastManyInFlight(World(), d.path());
}

TEST(BroadcastMpi, LargeShardsSplitIntoSlabs) {
  SharedDir d;
  BroadcastSlabs(World(), d.path());
}

TEST(BroadcastMpi, CorruptShardFailsEveryRank) {
  SharedDir d;
  BroadcastReadFailure(World(), d.path());
}

TEST(BroadcastMpi, EightRanks) {
  if (World()->size() != 8) FAIL() << "needs 8 ranks (ctest mpi.broadcast_8)";
  SharedDir d;
  BroadcastLoad(World(), d.path(), "tp2,dp4", "tp4,dp2");
  BroadcastLoad(World(), d.path(), "dp8", "dp8");
}

TEST(HuggingFaceMpi, DirectTensorParallelLoadReadsEachByteOnce) {
  if (World()->size() != 4) FAIL() << "needs 4 ranks (ctest runs it with mpirun -np 4)";
  SharedDir d;
  HuggingFaceDirectLoad(World(), d.path());
}

TEST(HostsMpi, BroadcastOnlyAcrossHosts) {
  if (World()->size() != 4 || !std::getenv("DCP_HOST_ID")) {
    FAIL() << "needs 4 ranks and DCP_HOST_ID per rank: the emulated hosts are missing (ctest "
              "mpi.two_hosts)";
  }
  SharedDir d;
  HostAwareBroadcast(World(), d.path());
}

// Ranks on real hosts (ctest mpi.hosts: tests/mpi/real_hosts.sh starts the job across network
// namespaces, each its own host name, and names the shared checkpoint directory).
TEST(RealHostsMpi, BroadcastAcrossHosts) {
  const char* hosts = std::getenv("DCP_TEST_HOSTS");
  const char* dir = std::getenv("DCP_TEST_DIR");
  if (!hosts || !dir) FAIL() << "needs DCP_TEST_HOSTS and DCP_TEST_DIR (ctest mpi.hosts)";
  RealHostsBroadcast(World(), dir, std::atoi(hosts));
}

}  // namespace
}  // namespace dcp::testing
