// This process's share of the node's CPUs, for work it may spread over threads of its own
// (staging copies, an incremental save's checksums).
#pragma once

namespace dcp {

// The CPUs this process may run on, divided among the ranks of its node (Open MPI's, MPICH's
// and torchrun's local-size variables), clamped to [1, 8].
int CpusPerLocalRank();

}  // namespace dcp
