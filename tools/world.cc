#include "tools/world.h"

#include <cstdlib>

#ifdef DCP_WITH_MPI
#include "dcp/mpi_comm.h"
#endif

namespace dcp::tools {

std::shared_ptr<Comm> WorldComm() {
#ifdef DCP_WITH_MPI
  // Set by Open MPI's launcher (and PMIx-based ones) for every process it starts.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK")) {
    EnsureMpiInitialized(nullptr, nullptr);
    return MpiComm(MPI_COMM_WORLD);
  }
#endif
  return LocalComm();
}

}  // namespace dcp::tools
