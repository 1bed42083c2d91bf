// The communicator a command runs on: MPI's world when launched by mpirun (and built with
// MPI), otherwise a world of one.
#pragma once

#include <memory>

#include "dcp/comm.h"

namespace dcp::tools {

// The world, created once per process. Its collective timeout is 10 minutes, or
// DCP_TIMEOUT_SECONDS when set (a positive number; anything else is an error).
std::shared_ptr<Comm> WorldComm();

// This process's rank in the world: from WorldComm() once created, else from the launcher's
// environment, else 0.
int WorldRank();

}  // namespace dcp::tools
