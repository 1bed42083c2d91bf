#include "bench/memory.h"

#include <cstdio>
#include <cstring>

namespace dcp::bench {

bool ResetPeakResident() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

ResidentMemory ReadResident() {
  ResidentMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::sscanf(line, "VmRSS: %llu kB", &kb) == 1) m.now = kb * 1024;
    if (std::sscanf(line, "VmHWM: %llu kB", &kb) == 1) m.peak = kb * 1024;
  }
  std::fclose(f);
  return m;
}

}  // namespace dcp::bench
