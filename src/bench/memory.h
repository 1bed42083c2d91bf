// This process's resident memory, for the per-phase peaks `dcp bench` reports (issue 20: no
// peer guarantees a host-RAM budget, and users of all of them report OOMs on save).
#pragma once

#include <cstdint>

namespace dcp::bench {

struct ResidentMemory {
  uint64_t now = 0;   // VmRSS, bytes; 0 when unknown
  uint64_t peak = 0;  // VmHWM: the peak since the process started or the last reset
};

// Resets the peak to the current resident size (Linux: "5" into /proc/self/clear_refs);
// false when the kernel does not allow it (the peak is then the process's lifetime peak).
bool ResetPeakResident();
ResidentMemory ReadResident();

}  // namespace dcp::bench
