// The communicator a command runs on: MPI's world when launched by mpirun (and built with
// MPI), otherwise a world of one.
#pragma once

#include <memory>

#include "dcp/comm.h"

namespace dcp::tools {

std::shared_ptr<Comm> WorldComm();

}  // namespace dcp::tools
