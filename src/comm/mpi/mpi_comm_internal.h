// Knobs of the MPI backend that tests lower to exercise the large-message paths cheaply.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>

#include "dcp/mpi_comm.h"

namespace dcp {

struct MpiLimits {
  // Largest total an Allgatherv/Gatherv may move: counts and displacements are int.
  uint64_t max_count = INT_MAX;
  // Bytes per MPI call when a buffer is split (broadcasts and large gathers).
  uint64_t chunk = uint64_t{1} << 30;
};

// MpiComm with non-default limits.
std::shared_ptr<Comm> MpiCommWithLimits(MPI_Comm comm, MpiLimits limits);

}  // namespace dcp
