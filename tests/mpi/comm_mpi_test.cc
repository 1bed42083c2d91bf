// The comm conformance suite (comm_conformance.h) over the MPI backend, with real processes:
//   mpirun -np 4 --oversubscribe comm_mpi_test
// plus what only MPI has: the large-message (chunked) paths, refusing calls after a timeout,
// and CreateGroup waiting for its members. Runs with any world size >= 1 (the checks that
// leave a rank out need >= 2).
//
// Every rank runs the same tests in the same order. At the end of each test the ranks agree on
// the verdict, so a failure on one rank fails that test on every rank; if any test failed, the
// program aborts the whole job (MPI_Abort) after all ranks are done, so mpirun exits non-zero
// even when a timed-out collective is still pending.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/mpi/mpi_comm_internal.h"
#include "comm_conformance.h"
#include "dcp/comm.h"
#include "dcp/mpi_comm.h"

namespace dcp::testing {
namespace {

using namespace std::chrono_literals;

// The world every test uses, unless it breaks a communicator on purpose.
Comm& World() {
  static std::shared_ptr<Comm> world = [] {
    auto c = MpiComm(MPI_COMM_WORLD);
    c->set_timeout(60s);
    return c;
  }();
  return *world;
}

// Every test ends with the ranks agreeing on the verdict: a rank whose checks passed fails the
// test too, naming the rank that failed.
class CommMpi : public ::testing::Test {
 protected:
  void TearDown() override {
    const bool failed_here = HasFailure();
    Status all =
        AgreeOnStatus(World(), failed_here ? Internal("see that rank's output") : OkStatus());
    if (!failed_here) {
      EXPECT_TRUE(all.ok()) << "failed on another rank: " << all.ToString();
    }
  }
};

// The checks that leave rank size-1 out, on a fresh communicator with a short timeout: the
// others' communicator is unusable afterwards, since MPI cannot cancel their collective. Once
// they are done, the absent rank runs `join` (with a long timeout) to complete what they
// abandoned, so nothing is pending at MPI_Finalize. `after` runs on the ranks that took part.
void RunWithAbsentRank(const std::function<void(Comm&)>& check,
                       const std::function<void(Comm&)>& join,
                       const std::function<void(Comm&)>& after = {}) {
  auto c = MpiComm(MPI_COMM_WORLD);
  c->set_timeout(200ms);
  const bool absent = World().rank() == World().size() - 1;
  check(*c);
  if (!absent && after) after(*c);
  DCP_ASSERT_OK(World().Barrier());
  if (absent) {
    c->set_timeout(60s);
    join(*c);
  }
  DCP_ASSERT_OK(World().Barrier());
}

// The shared suite, in the order of comm_conformance.h.

TEST_F(CommMpi, RankAndSize) {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CheckRankAndSize(World(), size, "mpi");
}

TEST_F(CommMpi, AllGatherIsInRankOrder) { CheckAllGatherIsInRankOrder(World()); }

TEST_F(CommMpi, GatherToNonZeroRoot) { CheckGatherToNonZeroRoot(World()); }

TEST_F(CommMpi, GatherRejectsBadRoot) { CheckGatherRejectsBadRoot(World()); }

TEST_F(CommMpi, BroadcastEmptyAndLarge) { CheckBroadcastEmptyAndLarge(World()); }

TEST_F(CommMpi, IBroadcastPipelined) { CheckIBroadcastPipelined(World()); }

TEST_F(CommMpi, IAllGatherVScattered) { CheckIAllGatherVScattered(World()); }

TEST_F(CommMpi, IScatterVParts) { CheckIScatterVParts(World()); }

// The ranks' marks go to a directory on this host: mpirun runs them all here.
TEST_F(CommMpi, BarrierSeparatesPhases) {
  std::string dir;
  if (World().rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dcp-comm-mpi-XXXXXX").string();
    if (mkdtemp(tmpl.data())) dir = tmpl;
  }
  DCP_ASSERT_OK(World().Broadcast(dir, 0));
  ASSERT_FALSE(dir.empty()) << "rank 0 could not make a directory";
  CheckBarrierSeparatesPhases(World(), dir);
  DCP_ASSERT_OK(World().Barrier());
  if (World().rank() == 0) std::filesystem::remove_all(dir);
}

TEST_F(CommMpi, ManyConsecutiveCollectivesDoNotMix) {
  CheckManyConsecutiveCollectivesDoNotMix(World());
}

TEST_F(CommMpi, CreateGroupInterleaved) { CheckCreateGroupInterleaved(World()); }

TEST_F(CommMpi, AgreeOnStatusSpreadsOneFailure) { CheckAgreeOnStatusSpreadsOneFailure(World()); }

// After the timeout MPI's communicator also refuses further calls.
TEST_F(CommMpi, BarrierTimesOutWhenOneRankIsAbsent) {
  if (World().size() < 2) GTEST_SKIP() << "a world of one has nobody to wait for";
  RunWithAbsentRank(
      CheckBarrierTimesOutWhenOneRankIsAbsent,
      [](Comm& c) { EXPECT_TRUE(c.Barrier().ok()); },  // completes the others' barrier
      [](Comm& c) { EXPECT_EQ(c.Barrier().code(), StatusCode::kFailedPrecondition); });
}

TEST_F(CommMpi, BroadcastTimesOutWhenRootIsAbsent) {
  if (World().size() < 2) GTEST_SKIP() << "a world of one has nobody to wait for";
  RunWithAbsentRank(CheckBroadcastTimesOutWhenRootIsAbsent, [](Comm& c) {
    // The others gave up waiting for the size; an empty payload sends nothing after it.
    std::string nothing;
    EXPECT_TRUE(c.Broadcast(nothing, c.rank()).ok());
  });
}

// Not run here: CheckTimeoutNamesOperationAndMissingRank (its absent rank must later join the
// abandoned AllGather's second half, which it cannot; MPI's naming of missing ranks is tested
// by mpi.hangs with a stopped process) and CheckMismatchedCollectivesFail (undefined
// behaviour in MPI).

// Only MPI: CreateGroup meets its members with point-to-point messages before
// MPI_Comm_create_group, with a timeout naming the absent member.
TEST_F(CommMpi, CreateGroupTimesOutNamingAbsentMember) {
  if (World().size() < 2) GTEST_SKIP() << "a world of one has nobody to wait for";
  const int absent = World().size() - 1;
  auto g = MpiComm(MPI_COMM_WORLD);
  g->set_timeout(200ms);
  if (World().rank() == 0) {
    auto sub = g->CreateGroup({0, absent});
    EXPECT_EQ(sub.status().code(), StatusCode::kDeadlineExceeded) << sub.status().ToString();
    EXPECT_NE(sub.status().message().find("rank(s) " + std::to_string(absent)), std::string::npos)
        << sub.status().message();
  }
  DCP_ASSERT_OK(World().Barrier());
}

// Only MPI: counts beyond the int limits, simulated with tiny limits: chunked broadcasts,
// all-gather by per-rank broadcasts, point-to-point gather.
TEST_F(CommMpi, ChunkedPaths) {
  auto c = MpiCommWithLimits(MPI_COMM_WORLD, MpiLimits{.max_count = 1000, .chunk = 777});
  c->set_timeout(60s);
  const int n = c->size();
  std::string mine = Pattern(3000 + 17 * c->rank(), c->rank());
  auto all = c->AllGather(mine);
  DCP_ASSERT_OK(all.status());
  ASSERT_EQ(static_cast<int>(all->size()), n);
  for (int r = 0; r < n; ++r) EXPECT_TRUE((*all)[r] == Pattern(3000 + 17 * r, r)) << "rank " << r;
  auto got = c->Gather(mine, n - 1);
  DCP_ASSERT_OK(got.status());
  if (c->rank() == n - 1) {
    ASSERT_EQ(static_cast<int>(got->size()), n);
    for (int r = 0; r < n; ++r) EXPECT_TRUE((*got)[r] == Pattern(3000 + 17 * r, r)) << "rank " << r;
  }
  CheckIAllGatherVScattered(*c);  // ranges over 777 bytes in several datatype blocks
  CheckIScatterVParts(*c);
  const std::string big = Pattern(10000, 9);
  std::string data = c->rank() == 0 ? big : "";
  DCP_ASSERT_OK(c->Broadcast(data, 0));
  EXPECT_TRUE(data == big);
  std::string buf = c->rank() == 0 ? big : std::string(big.size(), '\0');
  auto req = c->IBroadcast(std::as_writable_bytes(std::span(buf)), 0);
  DCP_ASSERT_OK(req.status());
  DCP_ASSERT_OK((*req)->Wait());
  EXPECT_TRUE(buf == big);
}

}  // namespace
}  // namespace dcp::testing
