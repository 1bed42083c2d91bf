// The comm conformance suite (tests/comm_conformance.h) over every in-process backend: local,
// threads and file (ranks as threads over a temporary directory), each at several world sizes.
// mpi/comm_mpi_test.cc runs the same checks over MPI with real processes.
#include "dcp/comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "comm/thread_comm.h"
#include "comm_conformance.h"
#include "test_util.h"

namespace dcp::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

struct Backend {
  std::string kind;  // "local", "threads" or "file"
  int n;
  // How ctest and gtest print it.
  friend void PrintTo(const Backend& b, std::ostream* os) { *os << b.kind << b.n; }
};

class CommTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam().kind == "file") {
      std::string tmpl = (fs::temp_directory_path() / "dcp-comm-test-XXXXXX").string();
      ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
      dir_ = tmpl;
    }
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  int n() const { return GetParam().n; }

  std::vector<std::shared_ptr<Comm>> MakeComms() {
    const Backend& b = GetParam();
    std::vector<std::shared_ptr<Comm>> comms;
    if (b.kind == "local") {
      comms.push_back(LocalComm());
    } else if (b.kind == "threads") {
      comms = MakeThreadComms(b.n);
    } else {
      for (int r = 0; r < b.n; ++r) comms.push_back(FileComm(dir_, r, b.n));
    }
    return comms;
  }

  // Runs `fn` on one thread per rank, each with its own Comm. A generous timeout turns a bug
  // into a failure instead of a hang.
  void RunRanks(const std::function<void(Comm&)>& fn,
                std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto comms = MakeComms();
    ASSERT_EQ(static_cast<int>(comms.size()), n());
    std::vector<std::jthread> threads;
    for (auto& c : comms) {
      c->set_timeout(timeout);
      threads.emplace_back([&fn, c] { fn(*c); });
    }
  }

  std::string dir_;
};

TEST_P(CommTest, RankAndSize) {
  RunRanks([&](Comm& c) { CheckRankAndSize(c, n(), GetParam().kind); });
}

TEST_P(CommTest, AllGatherIsInRankOrder) { RunRanks(CheckAllGatherIsInRankOrder); }

TEST_P(CommTest, GatherToNonZeroRoot) { RunRanks(CheckGatherToNonZeroRoot); }

TEST_P(CommTest, GatherRejectsBadRoot) { RunRanks(CheckGatherRejectsBadRoot); }

TEST_P(CommTest, BroadcastEmptyAndLarge) { RunRanks(CheckBroadcastEmptyAndLarge); }

TEST_P(CommTest, IBroadcastPipelined) { RunRanks(CheckIBroadcastPipelined); }

TEST_P(CommTest, IAllGatherVScattered) { RunRanks(CheckIAllGatherVScattered); }

TEST_P(CommTest, IScatterVParts) { RunRanks(CheckIScatterVParts); }

TEST_P(CommTest, BarrierSeparatesPhases) {
  TempDir marks;
  RunRanks([&](Comm& c) { CheckBarrierSeparatesPhases(c, marks.path()); });
}

TEST_P(CommTest, ManyConsecutiveCollectivesDoNotMix) {
  const int rounds = GetParam().kind == "file" ? 60 : 300;
  RunRanks([&](Comm& c) { CheckManyConsecutiveCollectivesDoNotMix(c, rounds); });
  if (GetParam().kind == "file") {
    // Files are removed once every reader is done with them: the directory stays small.
    size_t files = 0;
    if (fs::exists(dir_)) {
      for (const auto& e : fs::recursive_directory_iterator(dir_)) files += e.is_regular_file();
    }
    EXPECT_LE(files, static_cast<size_t>(4 * n())) << "leftover message files in " << dir_;
  }
}

TEST_P(CommTest, CreateGroupInterleaved) { RunRanks(CheckCreateGroupInterleaved); }

TEST_P(CommTest, AgreeOnStatusSpreadsOneFailure) { RunRanks(CheckAgreeOnStatusSpreadsOneFailure); }

// A status that was agreed already (a failed save inside a timed benchmark phase) keeps its
// one "rank R: " prefix when agreed again, and says it was agreed (the CLI prints it once).
TEST_P(CommTest, AgreeingTwiceAddsNoSecondPrefix) {
  RunRanks([](Comm& c) {
    const int last = c.size() - 1;
    Status once = AgreeOnStatus(c, c.rank() == last ? Unavailable("disk gone") : OkStatus());
    Status twice = AgreeOnStatus(c, once.Annotate("bench: save: "));
    ASSERT_FALSE(twice.ok());
    EXPECT_TRUE(once.agreed());
    EXPECT_TRUE(twice.agreed());
    const std::string want = c.size() == 1
                                 ? "bench: save: disk gone"
                                 : "bench: save: rank " + std::to_string(last) + ": disk gone";
    EXPECT_EQ(twice.message(), want);
  });
}

// The checks below leave a rank out, so the others wait for the (short) timeout.

TEST_P(CommTest, BarrierTimesOutWhenOneRankIsAbsent) {
  if (n() == 1) GTEST_SKIP() << "a world of one has nobody to wait for";
  RunRanks(CheckBarrierTimesOutWhenOneRankIsAbsent, 200ms);
}

TEST_P(CommTest, TimeoutNamesOperationAndMissingRank) {
  if (n() == 1) GTEST_SKIP() << "a world of one has nobody to wait for";
  RunRanks(CheckTimeoutNamesOperationAndMissingRank, 200ms);
}

TEST_P(CommTest, BroadcastTimesOutWhenRootIsAbsent) {
  if (n() == 1) GTEST_SKIP() << "a world of one has nobody to wait for";
  RunRanks(CheckBroadcastTimesOutWhenRootIsAbsent, 200ms);
}

TEST_P(CommTest, MismatchedCollectivesFail) {
  if (n() == 1) GTEST_SKIP() << "needs two ranks";
  RunRanks(CheckMismatchedCollectivesFail, 300ms);
}

INSTANTIATE_TEST_SUITE_P(Backends, CommTest,
                         ::testing::Values(Backend{"local", 1}, Backend{"threads", 1},
                                           Backend{"threads", 2}, Backend{"threads", 4},
                                           Backend{"file", 1}, Backend{"file", 2},
                                           Backend{"file", 4}),
                         [](const auto& info) {
                           return info.param.kind + std::to_string(info.param.n);
                         });

}  // namespace
}  // namespace dcp::testing
