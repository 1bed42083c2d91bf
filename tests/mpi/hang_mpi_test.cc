// Failure modes under real mpirun that a gtest program cannot host (the job must end):
//
//   hang_mpi_test absent SECONDS   the last rank stops itself (SIGSTOP) before an AllGather
//                                  the others run with a SECONDS timeout. They must fail
//                                  naming the missing rank, and the job must end (mpirun
//                                  returns non-zero) instead of waiting in MPI_Finalize.
//   hang_mpi_test funneled DIR     MPI initialized by the program with MPI_THREAD_FUNNELED:
//                                  an async save over MPI fails clearly (no hang). Exit 0
//                                  when every rank got that error.
//
// tests/mpi/hang_test.sh runs them and checks mpirun's exit status and output.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dcp/async.h"
#include "dcp/mpi_comm.h"

namespace {

int Absent(int argc, char** argv, double seconds) {
  dcp::EnsureMpiInitialized(&argc, &argv);
  auto world = dcp::MpiComm(MPI_COMM_WORLD);
  world->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  // One collective that works, so the stopped rank is known to have been alive.
  if (auto r = world->AllGather("hello"); !r.ok()) {
    std::fprintf(stderr, "hang_mpi_test: first AllGather failed: %s\n",
                 r.status().ToString().c_str());
    return 3;
  }
  if (world->rank() == world->size() - 1) {
    std::fprintf(stderr, "hang_mpi_test: rank %d stops itself\n", world->rank());
    std::fflush(nullptr);
    raise(SIGSTOP);
    // Continued by someone: never join the collective.
    while (true) pause();
  }
  auto r = world->AllGather("x");
  if (r.ok()) {
    std::fprintf(stderr, "hang_mpi_test: rank %d: AllGather succeeded without the stopped rank\n",
                 world->rank());
    return 4;
  }
  std::fprintf(stderr, "hang_mpi_test: rank %d: %s\n", world->rank(),
               r.status().ToString().c_str());
  std::fflush(nullptr);
  return 1;  // exit runs the at-exit finalize, which must not hang
}

int Funneled(int argc, char** argv, const std::string& dir) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  {
    auto world = dcp::MpiComm(MPI_COMM_WORLD);
    world->set_timeout(std::chrono::seconds(60));
    std::vector<float> data(16, 1.0f);
    dcp::StateDict sd;
    sd.add("w" + std::to_string(rank), dcp::TensorView(data.data(), dcp::DType::kF32, {16}));
    std::string error;
    try {
      dcp::AsyncSave h = dcp::async_save(sd, dir, {.comm = world});
      h.Get();
    } catch (const dcp::Error& e) {
      error = e.what();
    }
    if (error.find("MPI_THREAD_MULTIPLE") == std::string::npos) {
      std::fprintf(
          stderr,
          "hang_mpi_test: rank %d: expected an error naming MPI_THREAD_MULTIPLE, got '%s'\n", rank,
          error.c_str());
      rc = 1;
    } else if (rank == 0) {
      std::fprintf(stderr, "hang_mpi_test: funneled: %s\n", error.c_str());
    }
    // Every rank's verdict, over the still-usable communicator.
    int mine = rc, worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = worst;
  }
  MPI_Finalize();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "absent") == 0) {
    return Absent(argc, argv, std::atof(argv[2]));
  }
  if (argc == 3 && std::strcmp(argv[1], "funneled") == 0) {
    return Funneled(argc, argv, argv[2]);
  }
  std::fprintf(stderr, "usage: hang_mpi_test absent SECONDS | funneled DIR\n");
  return 2;
}
