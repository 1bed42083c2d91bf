// Ranks as threads of one process: the fast multi-rank backend of the tests (every multi-rank
// feature also runs under mpirun with real processes). Not part of the public API.
#pragma once

#include <memory>
#include <vector>

#include "dcp/comm.h"

namespace dcp {

// `n` ranks as threads of one process: returns one Comm per rank, each to be used by its own
// thread.
std::vector<std::shared_ptr<Comm>> MakeThreadComms(int n);

}  // namespace dcp
