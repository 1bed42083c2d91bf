// The main() of the gtest programs run under mpirun (comm_mpi_test, save_mpi_test): every rank
// runs every test in the same order; rank 0 prints the listing, the others only their failures
// (prefixed with the rank); then all ranks agree on the verdict over a fresh communicator, and a
// failed run ends the whole job (a timed-out collective may still be pending, which
// MPI_Finalize could wait for forever).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "dcp/comm.h"
#include "dcp/mpi_comm.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string program = argc > 0 ? argv[0] : "mpi test";
  ::testing::InitGoogleTest(&argc, argv);
  try {
    dcp::EnsureMpiInitialized(&argc, &argv);
  } catch (const dcp::Error& e) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
    return 2;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  auto verdict = dcp::MpiComm(MPI_COMM_WORLD);
  verdict->set_timeout(std::chrono::seconds(300));
  const dcp::Status all =
      dcp::AgreeOnStatus(*verdict, rc == 0 ? dcp::OkStatus() : dcp::Internal("tests failed"));
  if (rank == 0) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), all.ok() ? "PASSED" : all.ToString().c_str());
  }
  if (!all.ok()) {
    std::fflush(nullptr);
    if (rank == 0) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  return 0;
}
