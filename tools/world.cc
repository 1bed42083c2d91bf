#include "tools/world.h"

#include <chrono>
#include <cstdlib>
#include <string>

#ifdef DCP_WITH_MPI
#include "dcp/mpi_comm.h"
#endif

namespace dcp::tools {
namespace {

std::shared_ptr<Comm>& World() {
  static std::shared_ptr<Comm> world;
  return world;
}

// DCP_TIMEOUT_SECONDS, or the communicator's default.
void ApplyTimeout(Comm& comm) {
  const char* env = std::getenv("DCP_TIMEOUT_SECONDS");
  if (!env || !*env) return;
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (*end != '\0' || !(seconds > 0) || seconds > 1e7) {
    throw Error(InvalidArgument("DCP_TIMEOUT_SECONDS must be a positive number of seconds, got '" +
                                std::string(env) + "'"));
  }
  comm.set_timeout(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5)));
}

}  // namespace

std::shared_ptr<Comm> WorldComm() {
  std::shared_ptr<Comm>& world = World();
  if (world) return world;
  std::shared_ptr<Comm> comm;
#ifdef DCP_WITH_MPI
  // Set by Open MPI's launcher (and PMIx-based ones) for every process it starts.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK")) {
    EnsureMpiInitialized(nullptr, nullptr);
    comm = MpiComm(MPI_COMM_WORLD);
  }
#endif
  if (!comm) comm = LocalComm();
  ApplyTimeout(*comm);
  world = comm;
  return world;
}

int WorldRank() {
  if (World()) return World()->rank();
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

}  // namespace dcp::tools
