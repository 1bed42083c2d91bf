#include "core/cpu_share.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>

namespace dcp {

int CpusPerLocalRank() {
  cpu_set_t set;
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  int local_ranks = 1;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"}) {
    if (const char* v = std::getenv(var)) local_ranks = std::max(1, std::atoi(v));
  }
  return std::clamp(cpus / local_ranks, 1, 8);
}

}  // namespace dcp
