// A training job for the SIGKILL test (tests/mpi/manager_kill.sh): every rank of
// `mpirun -np 4` resumes from the manager's newest complete step, checks that every value it
// loaded is that step's (a complete step, never a mix), then saves every step until MAX_STEP.
//
//   manager_kill_driver ROOT MAX_STEP PID_DIR
//
// Prints "resumed S" (or "resumed none") and "saved S" lines (rank 0, flushed: a "saved" line
// means the manager's Save returned, so a later resume must start at S or later). Exit code 3:
// the loaded state was not the resumed step's.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "dcp/manager.h"
#include "dcp/mpi_comm.h"

namespace {

constexpr int64_t kRowsPerRank = 64, kCols = 1024;  // 256 KiB of f32 per rank

float Value(int64_t step, int rank, size_t i) {
  return static_cast<float>((step * 7919 + rank * 104729 + static_cast<int64_t>(i)) % 16777216);
}

}  // namespace

int main(int argc, char** argv) {
  dcp::EnsureMpiInitialized(&argc, &argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ROOT MAX_STEP PID_DIR\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  const int64_t max_step = std::atoll(argv[2]);
  auto comm = dcp::MpiComm(MPI_COMM_WORLD);
  comm->set_timeout(std::chrono::seconds(300));
  const int rank = comm->rank(), world = comm->size();
  std::ofstream(std::string(argv[3]) + "/rank" + std::to_string(rank) + ".pid") << getpid() << "\n";

  std::vector<float> w(static_cast<size_t>(kRowsPerRank * kCols));
  dcp::StateDict sd;
  sd.add("w", dcp::TensorView(w.data(), dcp::DType::kF32, dcp::Shape{kRowsPerRank, kCols}),
         dcp::Chunk{dcp::Shape{kRowsPerRank * world, kCols}, dcp::Shape{kRowsPerRank * rank, 0}});
  sd.add_bytes("step", std::string_view("none"));

  int rc = 0;
  try {
    dcp::CheckpointManager mgr(root, dcp::RetentionPolicy{.keep_last = 2}, comm);
    int64_t start = 1;
    if (auto latest = mgr.latest_step()) {
      std::fill(w.begin(), w.end(), -1.0f);
      mgr.Load(sd);
      bool good = true;
      for (size_t i = 0; i < w.size() && good; ++i) good = w[i] == Value(*latest, rank, i);
      const auto& b = sd.find("step")->bytes;
      good = good && std::string(reinterpret_cast<const char*>(b.data()), b.size()) ==
                         std::to_string(*latest);
      if (!good) {
        std::printf("MISMATCH rank %d: the state loaded is not step %lld's\n", rank,
                    static_cast<long long>(*latest));
        std::fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
      start = *latest + 1;
      if (rank == 0) std::printf("resumed %lld\n", static_cast<long long>(*latest));
    } else if (rank == 0) {
      std::printf("resumed none\n");
    }
    std::fflush(stdout);
    for (int64_t step = start; step <= max_step; ++step) {
      for (size_t i = 0; i < w.size(); ++i) w[i] = Value(step, rank, i);
      std::string s = std::to_string(step);
      sd.mutable_bytes(1).assign(reinterpret_cast<const std::byte*>(s.data()),
                                 reinterpret_cast<const std::byte*>(s.data()) + s.size());
      if (step % 2) {
        mgr.Save(step, sd);
      } else {
        mgr.AsyncSave(step, sd);
        mgr.Wait();
      }
      if (rank == 0) {
        std::printf("saved %lld\n", static_cast<long long>(step));
        std::fflush(stdout);
      }
    }
  } catch (const dcp::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
