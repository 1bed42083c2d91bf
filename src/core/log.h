// Opt-in diagnostics: DCP_LOG=1 in the environment prints each save's and load's phase
// timings and counters to stderr, one line per rank.
#pragma once

#include <cstdlib>
#include <cstring>

namespace dcp {

inline bool LogEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("DCP_LOG");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace dcp
